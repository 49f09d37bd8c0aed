package hub

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/internal/wait"
	"github.com/hubmesh/hub/internal/xdstest"
)

// gate is a slow member's API server: calls for one key block until the
// test releases them (or the caller gives up); every other call answers at
// once.
type gate struct {
	release  chan struct{}
	once     sync.Once
	started  atomic.Int32 // blocking calls begun
	returned atomic.Int32 // blocking calls ended
}

func newGate(t *testing.T) *gate {
	g := &gate{release: make(chan struct{})}
	t.Cleanup(g.open)
	return g
}

func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

// block waits for the release or ctx, counting the call.
func (g *gate) block(ctx context.Context) error {
	g.started.Add(1)
	defer g.returned.Add(1)
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// endpointIPs decodes an EDS response's addresses.
func endpointIPs(t *testing.T, r *discoveryv3.DiscoveryResponse) []string {
	t.Helper()
	var out []string
	for _, a := range r.Resources {
		var cla endpointv3.ClusterLoadAssignment
		if err := a.UnmarshalTo(&cla); err != nil {
			t.Fatal(err)
		}
		for _, l := range cla.Endpoints {
			for _, ep := range l.LbEndpoints {
				out = append(out, ep.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
			}
		}
	}
	return out
}

// TestPendingAccessReviewDelaysNoPush: a proxy asks for a Secret of
// another namespace while the member's SubjectAccessReview hangs. Pushes
// that re-evaluate that proxy's watch (secret rotations) and every other
// push (EDS, other proxies' SDS) go out while the review is still hanging,
// the review is asked once however often the watch is evaluated, and the
// waiting proxy gets nothing until it completes; then it gets the Secret
// (its first response waits: a client may never ask again, Istio's adsc
// acknowledges without resource names).
func TestPendingAccessReviewDelaysNoPush(t *testing.T) {
	g := newGate(t)
	var calls atomic.Int32
	authz := AuthorizerFunc(func(ctx context.Context, cluster, saNS, sa, ns string) (bool, error) {
		if ns != "slow" {
			return false, nil
		}
		calls.Add(1)
		if err := g.block(ctx); err != nil {
			return false, err
		}
		return true, nil
	})
	s := startSecureHub(t, Options{Authorizer: authz})
	gw, slow := clusters.ServiceKey{Namespace: "a", Name: "gw"}, clusters.ServiceKey{Namespace: "slow", Name: "gw"}
	setGW := func(i int) {
		s.secrets.mu.Lock()
		s.secrets.data["west"] = map[clusters.ServiceKey]*clusters.TLSSecret{
			gw:   {Cert: fmt.Appendf(nil, "CERT-%d", i), Key: []byte("KEY")},
			slow: {Cert: []byte("SLOW-CERT"), Key: []byte("SLOW-KEY")},
		}
		s.secrets.mu.Unlock()
		s.h.changes.SecretChanged("west", gw)
	}
	setGW(0)
	s.h.index.ReplaceCluster("west", []*clusters.Service{echoService("10.0.0.1")})

	// An EDS watcher and a proxy reading only its own namespace.
	const eds = "outbound|7070||echo.demo.svc.cluster.local"
	edsClient := xdstest.DialSotW(t, s.plain)
	edsClient.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node("eds", "west"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{eds}})
	nextEDS := func() []string {
		t.Helper()
		r, err := edsClient.Next(t)
		if err != nil {
			t.Fatal(err)
		}
		edsClient.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{eds}, ResponseNonce: r.Nonce, VersionInfo: r.VersionInfo})
		return endpointIPs(t, r)
	}
	if got := nextEDS(); fmt.Sprint(got) != "[10.0.0.1]" {
		t.Fatalf("first EDS: %v", got)
	}
	own := []string{"kubernetes://gw"}
	ownClient := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "a", "west")))
	ownClient.Send(t, sdsRequest("own", "west", own...))
	if got := secretsOf(t, ownClient, own); got["kubernetes://gw"] == nil {
		t.Fatalf("own namespace: %v", keys(got))
	}

	// The proxy that needs the hanging review.
	both := []string{"kubernetes://gw", "kubernetes://slow/gw"}
	waiting := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "a", "west")))
	// Its first request carries a response nonce of its own making, as
	// Istio's adsc sends: the first response is still the one that waits.
	first := sdsRequest("waiting", "west", both...)
	first.ResponseNonce = "2026-11-23 05:35:00.309502067 +0000 UTC m=+0.113318264"
	waiting.Send(t, first)
	wait.Until(t, 20*time.Second, func() error {
		if g.started.Load() == 0 {
			return fmt.Errorf("the access review has not been asked")
		}
		return nil
	})

	// Pushes keep flowing while it hangs: each rotation re-evaluates the
	// waiting proxy's watch too.
	for i := 1; i <= 3; i++ {
		setGW(i)
		ip := fmt.Sprintf("10.0.0.%d", i+1)
		s.h.index.ReplaceCluster("west", []*clusters.Service{echoService(ip)})
		if got := nextEDS(); fmt.Sprint(got) != "["+ip+"]" {
			t.Fatalf("EDS push %d: %v; want [%s]", i, got, ip)
		}
		got := secretsOf(t, ownClient, own)
		if c := string(got["kubernetes://gw"].GetTlsCertificate().GetCertificateChain().GetInlineBytes()); c != fmt.Sprint("CERT-", i) {
			t.Fatalf("SDS push %d to the other proxy: %q", i, c)
		}
		if g.returned.Load() != 0 {
			t.Fatal("the access review ended (timed out?) before the pushes went out: they waited for it")
		}
	}
	waiting.NoneYet(t, "the proxy whose access review is pending")
	if n := calls.Load(); n != 1 {
		t.Errorf("the pending review was asked %d times; want once", n)
	}

	// The review completes: the waiting proxy gets its first response with
	// both Secrets, gw as rotated.
	g.open()
	got := secretsOf(t, waiting, both)
	if c := string(got["kubernetes://slow/gw"].GetTlsCertificate().GetCertificateChain().GetInlineBytes()); c != "SLOW-CERT" {
		t.Fatalf("after the review: %v", keys(got))
	}
	if c := string(got["kubernetes://gw"].GetTlsCertificate().GetCertificateChain().GetInlineBytes()); c != "CERT-3" {
		t.Errorf("after the review gw is %q; want CERT-3", c)
	}
	ownClient.NoneYet(t, "a proxy that consulted no review, after the review completed")
}

// TestSilentMemberTokenReviewHoldsNoOtherStream: a proxy's service-account
// token is reviewed in a member that does not answer. Only that stream
// waits: other streams (token, certificate, plaintext) are served, pushes
// reach them, the proxy list answers, and the waiting
// stream is served once its member answers.
func TestSilentMemberTokenReviewHoldsNoOtherStream(t *testing.T) {
	g := newGate(t)
	tokens := TokenReviewerFunc(func(ctx context.Context, cluster, token string) (string, string, error) {
		switch {
		case cluster == "black" && token == "black-token":
			if err := g.block(ctx); err != nil {
				return "", "", err
			}
			return "a", "gw", nil
		case cluster == "west" && token == "good-token":
			return "a", "gw", nil
		}
		return "", "", fmt.Errorf("token not valid in %s", cluster)
	})
	s := startSecureHub(t, Options{Tokens: tokens})
	s.h.index.ReplaceCluster("west", []*clusters.Service{echoService("10.0.0.1")})
	cds := func(id, cluster string) *discoveryv3.DiscoveryRequest {
		return &discoveryv3.DiscoveryRequest{Node: xdstest.Node(id, cluster), TypeUrl: resourcev3.ClusterType}
	}

	silent := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.anonymous()), grpc.WithPerRPCCredentials(bearerCreds("black-token")))
	silent.Send(t, cds("silent", "black"))
	wait.Until(t, 20*time.Second, func() error {
		if g.started.Load() == 0 {
			return fmt.Errorf("the token review has not been asked")
		}
		return nil
	})

	const eds = "outbound|7070||echo.demo.svc.cluster.local"
	others := map[string]*xdstest.SotW{
		"token":       xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.anonymous()), grpc.WithPerRPCCredentials(bearerCreds("good-token"))),
		"certificate": xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "a", ""))),
		"plaintext":   xdstest.DialSotW(t, s.plain),
	}
	for name, c := range others {
		c.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node(name, "west"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{eds}})
		r, err := c.Next(t)
		if err != nil || fmt.Sprint(endpointIPs(t, r)) != "[10.0.0.1]" {
			t.Fatalf("%s: %v, %v; want the endpoints", name, r, err)
		}
		c.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{eds}, ResponseNonce: r.Nonce, VersionInfo: r.VersionInfo})
	}
	s.h.index.ReplaceCluster("west", []*clusters.Service{echoService("10.0.0.2")})
	for name, c := range others {
		r, err := c.Next(t)
		if err != nil || fmt.Sprint(endpointIPs(t, r)) != "[10.0.0.2]" {
			t.Fatalf("%s after a change: %v, %v; want the new endpoints", name, r, err)
		}
	}
	if n := len(s.h.Proxies()); n < len(others) {
		t.Errorf("the proxy list shows %d streams; want at least %d", n, len(others))
	}
	if g.returned.Load() != 0 {
		t.Fatal("the token review ended (timed out?) before the other streams were served: they waited for it")
	}
	silent.NoneYet(t, "the stream whose token review is pending")

	g.open()
	if r, err := silent.Next(t); err != nil || len(r.Resources) != 1 {
		t.Fatalf("after its member answered: %v, %v; want the cluster", r, err)
	}
}
