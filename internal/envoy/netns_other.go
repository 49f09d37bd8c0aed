//go:build !linux

package envoy

import (
	"context"
	"errors"
	"net"
	"syscall"
)

func sysProcAttr() *syscall.SysProcAttr { return nil }

func (p *AdminAPI) dialAdmin(ctx context.Context, network, addr string) (net.Conn, error) {
	if p.netns != "" {
		return nil, errors.New("envoy: network namespaces need Linux")
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}
