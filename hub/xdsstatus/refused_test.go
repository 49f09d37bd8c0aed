package xdsstatus

import (
	"fmt"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRefusalsKeepTheMostRecentClipped: the hub remembers the most recent
// refusals, newest first, bounded, with the node ID and message clipped,
// and counts them by gRPC code.
func TestRefusalsKeepTheMostRecentClipped(t *testing.T) {
	r := NewRefusals()
	for i := range maxRefusedKept + 10 {
		r.Record(Proxy{Address: "10.0.0.1:1"}, &corev3.Node{Id: fmt.Sprintf("n%d", i)}, status.Error(codes.InvalidArgument, "bad"))
	}
	r.Record(Proxy{}, &corev3.Node{Id: strings.Repeat("x", 4096)}, status.Error(codes.Unauthenticated, strings.Repeat("m", 4096)))
	got := r.List()
	if len(got) != maxRefusedKept {
		t.Fatalf("kept %d; want %d", len(got), maxRefusedKept)
	}
	if got[0].Code != "Unauthenticated" || len(got[0].ID) > 300 || len(got[0].Message) > 600 {
		t.Errorf("newest: code %s, %d-byte ID, %d-byte message; want Unauthenticated, clipped", got[0].Code, len(got[0].ID), len(got[0].Message))
	}
	if got[1].ID != fmt.Sprintf("n%d", maxRefusedKept+9) || got[len(got)-1].ID != "n11" {
		t.Errorf("order: %s … %s; want n%d … n11", got[1].ID, got[len(got)-1].ID, maxRefusedKept+9)
	}
}
