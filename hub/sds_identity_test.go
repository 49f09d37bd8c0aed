package hub

import (
	"fmt"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/internal/wait"
	"github.com/hubmesh/hub/internal/xdstest"
)

// TestNodeSentAgainMidStreamChangesNothing: a proxy whose certificate is
// bound to west gets west's Secret, then sends a node again on a request of
// another type, claiming to be in east. The xDS protocol makes a node sent
// again on a stream the same node: the stream keeps the one it started
// with (which was checked), so the late claim is ignored, neither a
// conflict nor a new identity, and the Secret's rotation still reaches it.
func TestNodeSentAgainMidStreamChangesNothing(t *testing.T) {
	s := startSecureHub(t, Options{})
	gw := clusters.ServiceKey{Namespace: "a", Name: "gw"}
	rotate := func(i int) {
		s.secrets.mu.Lock()
		s.secrets.data["west"] = map[clusters.ServiceKey]*clusters.TLSSecret{gw: {Cert: fmt.Appendf(nil, "CERT-%d", i), Key: []byte("KEY")}}
		s.secrets.mu.Unlock()
		s.h.changes.SecretChanged("west", gw)
	}
	rotate(0)
	names := []string{"kubernetes://gw"}
	c := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "a", "west")))
	c.Send(t, sdsRequest("turncoat", "west", names...))
	if got := secretsOf(t, c, names); got["kubernetes://gw"] == nil {
		t.Fatalf("before the second node: %v; want the Secret", keys(got))
	}
	// The SDS watch is parked (ACKed). A CDS request with a node that
	// claims east; its answer says the stream took it.
	c.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node("turncoat-2", "east"), TypeUrl: resourcev3.ClusterType})
	if r, err := c.Next(t); err != nil || r.TypeUrl != resourcev3.ClusterType {
		t.Fatalf("CDS request: %v, %v", r.GetTypeUrl(), err)
	}
	for _, p := range s.h.Proxies() {
		if p.ID != "turncoat" || p.Cluster != "west" || p.Warning != "" {
			t.Fatalf("after a second node the stream is %+v; want the first node's, west, no warning", p)
		}
	}
	rotate(1)
	wait.Until(t, 20*time.Second, func() error {
		got := secretsOf(t, c, names)
		if sec := got["kubernetes://gw"]; sec == nil || string(sec.GetTlsCertificate().GetCertificateChain().GetInlineBytes()) != "CERT-1" {
			return fmt.Errorf("pushed %v; want the rotated Secret", keys(got))
		}
		return nil
	})
}
