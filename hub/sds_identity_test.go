package hub

import (
	"fmt"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/internal/wait"
)

// TestConflictMidStreamStopsSecretPushes: a proxy whose certificate is
// bound to west gets west's Secret, then (on a request of another type)
// claims to be in east. From then on it is in conflict and gets no
// Kubernetes Secrets: a rotation of the Secret is not pushed to its SDS
// watch, which was parked before the claim changed.
func TestConflictMidStreamStopsSecretPushes(t *testing.T) {
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
	c := dialADS(t, s.secure, s.workload(t, s.ca, "a", "west"))
	c.send(t, sdsRequest("turncoat", "west", names...))
	if got := c.secretsOf(t, names); got["kubernetes://gw"] == nil {
		t.Fatalf("before the conflict: %v; want the Secret", keys(got))
	}
	// The SDS watch is parked (ACKed). A CDS request with a node that
	// claims east.
	c.send(t, &discoveryv3.DiscoveryRequest{Node: node("turncoat", "east"), TypeUrl: resourcev3.ClusterType})
	wait.Until(t, 20*time.Second, func() error {
		for _, p := range s.h.Proxies() {
			if p.ID == "turncoat" && p.Warning != "" {
				return nil
			}
		}
		return fmt.Errorf("the conflict is not in the proxy's status yet")
	})

	rotate(1)
	// The push evaluates the parked watch: it must withhold the Secret.
	wait.Until(t, 20*time.Second, func() error {
		select {
		case r := <-c.ch:
			if r.TypeUrl == resourcev3.SecretType {
				for _, a := range r.Resources {
					var sec tlsv3.Secret
					if err := a.UnmarshalTo(&sec); err != nil {
						t.Fatal(err)
					}
					t.Fatalf("a proxy in conflict was pushed %s (%q)", sec.Name, sec.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
				}
			}
		default:
		}
		if s.logs.count("SDS resource withheld", map[string]string{"proxy": "turncoat", "resource": "kubernetes://gw"}) == 0 {
			return fmt.Errorf("the rotation was not evaluated for the proxy yet")
		}
		return nil
	})
}
