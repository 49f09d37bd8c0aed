package api

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/hubmesh/hub/hub/xdsstatus"
)

// TestToProxyBoundsNackError: a proxy's NACK text is its own to choose (up
// to a whole gRPC message); the API and the dashboard show at most
// MaxNackError bytes of it, cut on a character boundary.
func TestToProxyBoundsNackError(t *testing.T) {
	long := strings.Repeat("é", 64<<10) // 128 KiB of two-byte characters
	p := ToProxy(xdsstatus.Proxy{ID: "p", Types: []xdsstatus.Type{{TypeURL: "x", NackError: long}, {TypeURL: "y", NackError: "short"}}})
	got := p.Types[0].NackError
	if len(got) > MaxNackError+len("…") || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Errorf("NackError of %d bytes shown as %d bytes (valid UTF-8 %v)", len(long), len(got), utf8.ValidString(got))
	}
	if p.Types[1].NackError != "short" {
		t.Errorf("short NackError changed: %q", p.Types[1].NackError)
	}
}
