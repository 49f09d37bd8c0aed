package hub

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"golang.org/x/time/rate"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/xdsstatus"
	"github.com/hubmesh/hub/internal/xdstest"
)

// syncState is one proxy as a TypeSyncz response lists it.
type syncState struct {
	cluster, namespace string
	types              map[string]statusv3.ConfigStatus // short type → state
}

// syncz asks c's stream for TypeSyncz (as istioctl does: a fresh request)
// and decodes the answer by proxy ID.
func askSyncz(t *testing.T, c *xdstest.SotW) (map[string]syncState, *discoveryv3.DiscoveryResponse) {
	t.Helper()
	c.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node("istioctl", ""), TypeUrl: TypeSyncz})
	r := c.ExpectType(t, TypeSyncz, "syncz")
	out := map[string]syncState{}
	for _, a := range r.Resources {
		var cc statusv3.ClientConfig
		if err := a.UnmarshalTo(&cc); err != nil {
			t.Fatalf("syncz resource: %v", err)
		}
		f := cc.GetNode().GetMetadata().GetFields()
		s := syncState{cluster: f["CLUSTER_ID"].GetStringValue(), namespace: f["NAMESPACE"].GetStringValue(), types: map[string]statusv3.ConfigStatus{}}
		for _, g := range cc.GenericXdsConfigs {
			s.types[shortType(g.TypeUrl)] = g.ConfigStatus
			if g.ConfigStatus == statusv3.ConfigStatus_ERROR && g.GetErrorState().GetDetails() == "" {
				t.Errorf("%s %s is ERROR without the NACK's details", cc.GetNode().GetId(), g.TypeUrl)
			}
		}
		out[cc.GetNode().GetId()] = s
	}
	return out, r
}

func proxyNode(id, cluster, namespace string) *discoveryv3.DiscoveryRequest {
	meta, _ := structpb.NewStruct(map[string]any{"CLUSTER_ID": cluster, "NAMESPACE": namespace, "ISTIO_VERSION": "1.31.0"})
	n := xdstest.Node(id, cluster)
	n.Metadata = meta
	return &discoveryv3.DiscoveryRequest{Node: n}
}

// TestSynczListsProxiesWithTheirSyncState: on the plaintext port a
// TypeSyncz request is answered with one ClientConfig per proxy stream (not
// the asking stream), each type SYNCED once its last response is ACKed,
// STALE before, ERROR after a NACK; the answer names the hub as control
// plane; its ACK is not answered, a new request is.
func TestSynczListsProxiesWithTheirSyncState(t *testing.T) {
	h, addr, _ := serveHub(t, Options{Instance: "hub-0"})
	twoServices(h)
	plain := insecure.NewCredentials()

	synced := xdstest.DialSotW(t, addr, grpc.WithTransportCredentials(plain))
	req := proxyNode("sidecar~10.0.0.5~a-1.demo~demo.svc.cluster.local", "west", "demo")
	req.TypeUrl = resourcev3.ClusterType
	synced.Send(t, req)
	cds := synced.ExpectType(t, resourcev3.ClusterType, "CDS")
	synced.Send(t, ack(resourcev3.ClusterType, nil, cds))
	synced.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{edsA}})
	eds := synced.ExpectType(t, resourcev3.EndpointType, "EDS")
	synced.Send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{edsA}, ResponseNonce: eds.Nonce, ErrorDetail: &rpcstatus.Status{Code: 3, Message: "bad endpoints"}})
	xdstest.Barrier(t, synced, "after the ACK and the NACK") // both recorded

	stale := xdstest.DialSotW(t, addr, grpc.WithTransportCredentials(plain))
	req = proxyNode("sidecar~10.1.0.5~b-1.other~other.svc.cluster.local", "east", "other")
	req.TypeUrl = resourcev3.ClusterType
	stale.Send(t, req)
	staleCDS := stale.ExpectType(t, resourcev3.ClusterType, "CDS") // not ACKed yet

	ctl := xdstest.DialSotW(t, addr, grpc.WithTransportCredentials(plain))
	got, r := askSyncz(t, ctl)
	if len(got) != 2 {
		t.Fatalf("syncz lists %v; want the two proxies, not the asking stream", got)
	}
	a := got["sidecar~10.0.0.5~a-1.demo~demo.svc.cluster.local"]
	if a.cluster != "west" || a.namespace != "demo" || a.types["Cluster"] != statusv3.ConfigStatus_SYNCED ||
		a.types["ClusterLoadAssignment"] != statusv3.ConfigStatus_ERROR || len(a.types) != 3 {
		t.Errorf("the ACKing proxy is listed as %+v; want west/demo, CDS SYNCED, EDS ERROR (and the barrier type)", a)
	}
	b := got["sidecar~10.1.0.5~b-1.other~other.svc.cluster.local"]
	if b.cluster != "east" || b.namespace != "other" || b.types["Cluster"] != statusv3.ConfigStatus_STALE {
		t.Errorf("the silent proxy is listed as %+v; want east/other, CDS STALE", b)
	}
	var cp struct{ Component, ID string }
	if err := json.Unmarshal([]byte(r.GetControlPlane().GetIdentifier()), &cp); err != nil || cp.Component != "hub" || cp.ID != "hub-0" {
		t.Errorf("control plane %q (%v); want component hub, ID hub-0", r.GetControlPlane().GetIdentifier(), err)
	}

	// The ACK is not answered; a new request is, with the new state.
	ctl.Send(t, ack(TypeSyncz, nil, r))
	xdstest.Barrier(t, ctl, "after the syncz ACK")
	stale.Send(t, ack(resourcev3.ClusterType, nil, staleCDS))
	xdstest.Barrier(t, stale, "after the late ACK")
	got, _ = askSyncz(t, ctl)
	if s := got["sidecar~10.1.0.5~b-1.other~other.svc.cluster.local"].types["Cluster"]; s != statusv3.ConfigStatus_SYNCED {
		t.Errorf("after its ACK the proxy's CDS is %s; want SYNCED", s)
	}
}

// TestSynczOnTheMTLSPortIsScopedToTheCallersNamespace: on the mTLS port a
// tenant's identity sees the proxies verified in its own namespace only
// (not another namespace's, not a plaintext proxy that claims its
// namespace); Istio's root namespace asserted by the home cluster sees
// every proxy; a federated trust domain's identity, and one its member may
// not assert, are refused with PermissionDenied, an anonymous stream with
// Unauthenticated.
func TestSynczOnTheMTLSPortIsScopedToTheCallersNamespace(t *testing.T) {
	scopes := &fakeScopes{m: map[string]clusters.IdentityScope{"home": {Synced: true, Home: true}, "west": {Synced: true}}}
	s := startSecureHub(t, Options{RootNamespace: "istio-system", IdentityScopes: scopes})
	s.h.index.ReplaceCluster("west", []*clusters.Service{echoService("10.0.0.1")})
	connect := func(c *xdstest.SotW, id, namespace string) {
		req := proxyNode(id, "west", namespace)
		req.TypeUrl = resourcev3.ClusterType
		c.Send(t, req)
		r := c.ExpectType(t, resourcev3.ClusterType, id+" CDS")
		c.Send(t, ack(resourcev3.ClusterType, nil, r))
		xdstest.Barrier(t, c, id+" ACK")
	}
	connect(xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "a", "west"))), "proxy-a", "a")
	connect(xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "b", "west"))), "proxy-b", "b")
	connect(xdstest.DialSotW(t, s.plain), "claims-a", "a")
	connect(xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.peerCA, "a", ""))), "peer-a", "a")

	tenant, _ := askSyncz(t, xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "a", "west"))))
	if len(tenant) != 1 || tenant["proxy-a"].types["Cluster"] != statusv3.ConfigStatus_SYNCED || tenant["proxy-a"].namespace != "a" {
		t.Errorf("namespace a's identity sees %v; want proxy-a alone, CDS SYNCED", tenant)
	}
	root, _ := askSyncz(t, xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "istio-system", "home"))))
	if len(root) != 4 {
		t.Errorf("the home cluster's root namespace identity sees %v; want all four proxies", root)
	}
	// The root namespace of a member not annotated for it: refused; bound
	// to no member: its own namespace only (no proxy there).
	notRoot := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "istio-system", "west")))
	notRoot.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node("istioctl", ""), TypeUrl: TypeSyncz})
	notRoot.Refused(t, "syncz from a root namespace identity its member may not assert", codes.PermissionDenied)
	if unbound, _ := askSyncz(t, xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "istio-system", "")))); len(unbound) != 0 {
		t.Errorf("a root namespace identity bound to no member sees %v; want no proxy", unbound)
	}
	plain, _ := askSyncz(t, xdstest.DialSotW(t, s.plain))
	if len(plain) != 4 {
		t.Errorf("the plaintext port lists %v; want all four proxies", plain)
	}

	peer := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.peerCA, "istio-system", "")))
	peer.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node("istioctl", ""), TypeUrl: TypeSyncz})
	peer.Refused(t, "syncz from a federated trust domain's identity", codes.PermissionDenied)
	anon := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.anonymous()))
	anon.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node("istioctl", ""), TypeUrl: TypeSyncz})
	anon.Refused(t, "syncz from an anonymous stream", codes.Unauthenticated)
}

// TestSynczOverDelta: a Delta stream gets the same list, named by proxy ID.
func TestSynczOverDelta(t *testing.T) {
	h, addr, _ := serveHub(t, Options{})
	twoServices(h)
	p := xdstest.DialSotW(t, addr)
	req := proxyNode("proxy-1", "west", "demo")
	req.TypeUrl = resourcev3.ClusterType
	p.Send(t, req)
	p.ExpectType(t, resourcev3.ClusterType, "CDS")

	st := xdstest.DialDelta(t, addr)
	st.Send(t, &discoveryv3.DeltaDiscoveryRequest{Node: xdstest.Node("istioctl", ""), TypeUrl: TypeSyncz})
	r := st.Expect(t, "Delta syncz")
	if len(r.Resources) != 1 || r.Resources[0].Name != "proxy-1" {
		t.Fatalf("Delta syncz: %d resources %v; want proxy-1", len(r.Resources), r.Resources)
	}
	var cc statusv3.ClientConfig
	if err := r.Resources[0].Resource.UnmarshalTo(&cc); err != nil || len(cc.GenericXdsConfigs) != 1 ||
		cc.GenericXdsConfigs[0].ConfigStatus != statusv3.ConfigStatus_STALE {
		t.Errorf("Delta syncz ClientConfig %v (%v); want CDS STALE", &cc, err)
	}
}

func TestSyncStatus(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		name string
		ts   xdsstatus.Type
		want statusv3.ConfigStatus
	}{
		{"nothing sent", xdsstatus.Type{}, statusv3.ConfigStatus_NOT_SENT},
		{"sent, not answered", xdsstatus.Type{SentNonce: "2"}, statusv3.ConfigStatus_STALE},
		{"an older one ACKed", xdsstatus.Type{SentNonce: "4", AckedNonce: "2", AckedAt: now}, statusv3.ConfigStatus_STALE},
		{"the last one ACKed", xdsstatus.Type{SentNonce: "4", AckedNonce: "4", AckedAt: now}, statusv3.ConfigStatus_SYNCED},
		{"NACKed", xdsstatus.Type{SentNonce: "4", AckedNonce: "2", AckedAt: now, Nacks: 1, NackedAt: now.Add(time.Second)}, statusv3.ConfigStatus_ERROR},
		{"ACKed after a NACK", xdsstatus.Type{SentNonce: "6", AckedNonce: "6", AckedAt: now.Add(time.Second), Nacks: 1, NackedAt: now}, statusv3.ConfigStatus_SYNCED},
	} {
		if got := syncStatus(c.ts); got != c.want {
			t.Errorf("%s: %s; want %s", c.name, got, c.want)
		}
	}
}

// TestSynczPlaintextAnswersLoopbackOnly: a plaintext caller that is not on
// loopback (any pod of the cluster, once the port is on) is refused with
// Unauthenticated, as istiod refuses a caller without an identity; loopback
// (kubectl port-forward) sees every proxy.
func TestSynczPlaintextAnswersLoopbackOnly(t *testing.T) {
	z := &syncz{tracker: &proxyTracker{}}
	for addr, want := range map[string]codes.Code{
		"127.0.0.1:40000":      codes.OK,
		"[::1]:40000":          codes.OK,
		"[::ffff:127.0.0.1]:1": codes.OK,
		"10.244.1.7:40000":     codes.Unauthenticated,
		"198.18.0.1:40000":     codes.Unauthenticated,
		"[fd00::1]:40000":      codes.Unauthenticated,
		"":                     codes.Unauthenticated,
		"@":                    codes.Unauthenticated,
	} {
		c := newConn(1)
		c.state.plaintext, c.state.status.Address = true, addr
		sc, err := z.scope(c)
		if got := status.Code(err); got != want || (want == codes.OK) != (sc.all && sc.loopback) {
			t.Errorf("plaintext syncz from %q: %+v, %v; want %v", addr, sc, err, want)
		}
	}
}

// TestSynczPacesMTLSCallers: over its pace (here one answer an hour) a
// tenant's request ends its stream with ResourceExhausted at once, while
// another namespace's identity and the loopback operator are answered.
func TestSynczPacesMTLSCallers(t *testing.T) {
	scopes := &fakeScopes{m: map[string]clusters.IdentityScope{"west": {Synced: true}}}
	s := startSecureHub(t, Options{IdentityScopes: scopes, Limits: Limits{debugRate: rate.Every(time.Hour), debugBurst: 1}})
	if _, r := askSyncz(t, xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "a", "west")))); r.TypeUrl != TypeSyncz {
		t.Fatalf("the first request of namespace a: %v", r)
	}
	again := xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "a", "west")))
	again.Send(t, &discoveryv3.DiscoveryRequest{Node: xdstest.Node("istioctl", ""), TypeUrl: TypeSyncz})
	again.Refused(t, "namespace a's second request within its pace", codes.ResourceExhausted)
	if _, r := askSyncz(t, xdstest.DialSotW(t, s.secure, grpc.WithTransportCredentials(s.workload(t, s.ca, "b", "west")))); r.TypeUrl != TypeSyncz {
		t.Errorf("namespace b, with a turn of its own: %v", r)
	}
	if _, r := askSyncz(t, xdstest.DialSotW(t, s.plain)); r.TypeUrl != TypeSyncz {
		t.Errorf("the loopback operator: %v", r)
	}
}

// TestSynczLoopbackIsNotASidecarsInbound: the plaintext port's syncz
// answers callers on loopback, but not 127.0.0.6, the address an Istio
// sidecar passes every inbound connection from.
func TestSynczLoopbackIsNotASidecarsInbound(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:5000": true, "[::1]:5000": true, "127.0.0.2:5000": true, "[::ffff:127.0.0.1]:5000": true,
		"127.0.0.6:5000": false, "[::6]:5000": false, "[::ffff:127.0.0.6]:5000": false, "10.0.0.1:5000": false, "bad": false,
	} {
		if got := loopbackAddr(addr); got != want {
			t.Errorf("loopbackAddr(%s) = %v, want %v", addr, got, want)
		}
	}
}

// TestSynczPaceIsSharedFairly: a tenant asking from many namespaces of
// one member gets at most its member's share of the replica's pace; the
// callers of another member still get answers, and so do operators (the
// root namespace), whom no tenant can pace out.
func TestSynczPaceIsSharedFairly(t *testing.T) {
	z := newSyncz(nil, nil, nil, "istio-system", "test", Limits{debugRate: debugPerCallerPerSecond, debugBurst: debugPerCallerBurst})
	answered := 0
	for ns := range 20 { // 20 namespaces × their whole burst, at once
		for range debugPerCallerBurst {
			if z.allow(synczCaller{"west", fmt.Sprintf("tenant-%d", ns)}, false) {
				answered++
			}
		}
	}
	if answered != debugPerMemberBurst {
		t.Errorf("one member's tenants got %d answers at once; want its share, %d", answered, debugPerMemberBurst)
	}
	if !z.allow(synczCaller{"east", "shop"}, false) {
		t.Error("another member's caller was paced out by west's tenants")
	}
	for range debugPerCallerBurst {
		if !z.allow(synczCaller{"west", "istio-system"}, true) {
			t.Fatal("an operator (root namespace) was paced out by the tenants")
		}
	}
}
