// Package ewgateway is a stand-in for Istio's east-west gateway, for the
// demo and the tests (no Envoy binary is available to them): a TCP
// passthrough that plays the Gateway cross-network-gateway on port 15443
// with TLS AUTO_PASSTHROUGH. It reads the TLS ClientHello's server name
// without terminating TLS, looks it up in its routes (what istiod's
// SNI-DNAT clusters outbound_.<port>_._.<host> are on a real gateway),
// dials one of that name's backends in its own network and copies bytes
// both ways, the ClientHello included: mTLS stays end to end, the gateway
// never holds a key.
package ewgateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/hubmesh/hub/internal/tcpproxy"
)

// Gateway routes connections by their TLS server name.
type Gateway struct {
	// Routes are the backends (ip:port) of each server name, tried in turn
	// from a rotating start until one accepts.
	Routes map[string][]string
	// Dial connects to a backend (nil: net.Dialer in this process's
	// network namespace).
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// Routed, if set, is told of each connection routed (sni, backend)
	// and Refused of each refused one, with why; both may be called
	// concurrently.
	Routed  func(sni, backend string)
	Refused func(sni string, err error)

	next atomic.Uint64
}

// Serve accepts connections on lis until ctx is done, then closes lis and
// every connection and returns when they have ended.
func (g *Gateway) Serve(ctx context.Context, lis net.Listener) {
	tcpproxy.Serve(ctx, lis, g.connect)
}

// connect reads c's ClientHello, dials a backend of its server name and
// replays the hello to it; nil when refused (reported).
func (g *Gateway) connect(ctx context.Context, c net.Conn) net.Conn {
	sni, hello, err := PeekServerName(c)
	if err != nil {
		g.refuse(sni, err)
		return nil
	}
	backends := g.Routes[sni]
	if len(backends) == 0 {
		g.refuse(sni, errors.New("no route for this server name"))
		return nil
	}
	dial := g.Dial
	if dial == nil {
		d := &net.Dialer{Timeout: 5 * time.Second}
		dial = func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
	}
	start := int(g.next.Add(1))
	var errs []error
	for i := range backends {
		addr := backends[(start+i)%len(backends)]
		b, err := dial(ctx, addr)
		if err != nil {
			errs = append(errs, fmt.Errorf("dialing %s: %w", addr, err))
			continue
		}
		if _, err := b.Write(hello); err != nil {
			b.Close()
			errs = append(errs, fmt.Errorf("writing to %s: %w", addr, err))
			continue
		}
		if g.Routed != nil {
			g.Routed(sni, addr)
		}
		return b
	}
	g.refuse(sni, errors.Join(errs...))
	return nil
}

func (g *Gateway) refuse(sni string, err error) {
	if g.Refused != nil {
		g.Refused(sni, err)
	}
}

// PeekServerName reads a TLS ClientHello from c and returns its server
// name and the bytes read (to be replayed to the backend). It lets
// crypto/tls parse the hello and stops the handshake there.
func PeekServerName(c net.Conn) (string, []byte, error) {
	var read bytes.Buffer
	var sni string
	errStop := errors.New("hello read")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	err := tls.Server(recordingConn{Conn: c, r: io.TeeReader(c, &read)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni = h.ServerName
			return nil, errStop
		},
	}).HandshakeContext(context.Background())
	if !errors.Is(err, errStop) && sni == "" {
		return "", nil, fmt.Errorf("not a TLS ClientHello: %v", err)
	}
	return sni, read.Bytes(), nil
}

// recordingConn reads through r and never writes (the handshake is
// stopped before crypto/tls answers).
type recordingConn struct {
	net.Conn
	r io.Reader
}

func (c recordingConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c recordingConn) Write(p []byte) (int, error) { return len(p), nil }
