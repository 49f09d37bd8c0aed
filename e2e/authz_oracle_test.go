package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacpb "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	rbachttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"

	"github.com/hubmesh/hub/distribute"
	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/xdstest"
)

// inboundShape is what the oracle test compares of an inbound listener:
// its RBAC filters' rules and its TLS.
type inboundShape struct {
	Deny, Allow *rbacpb.RBAC // nil: no such filter
	TLS         bool         // a DownstreamTlsContext
	RequireCert bool
	Identity    string // the certificate provider instance/certificate of the server's identity
}

// diff describes how b differs from a ("" when equal, RBAC compared as
// protos).
func (a inboundShape) diff(b inboundShape) string {
	var out []string
	for _, f := range []struct {
		name string
		x, y *rbacpb.RBAC
	}{{"DENY", a.Deny, b.Deny}, {"ALLOW", a.Allow, b.Allow}} {
		if (f.x == nil) != (f.y == nil) || !proto.Equal(f.x, f.y) {
			out = append(out, fmt.Sprintf("%s filter:\n  istiod: %s\n  hub:    %s", f.name, prototext.Format(f.x), prototext.Format(f.y)))
		}
	}
	if a.TLS != b.TLS || a.RequireCert != b.RequireCert || a.Identity != b.Identity {
		out = append(out, fmt.Sprintf("TLS: istiod %v/%v/%s, hub %v/%v/%s (TLS, client certificate required, identity provider)", a.TLS, a.RequireCert, a.Identity, b.TLS, b.RequireCert, b.Identity))
	}
	return strings.Join(out, "\n")
}

// shapeOf reads an inbound listener's shape.
func shapeOf(l *listenerv3.Listener) (inboundShape, error) {
	var s inboundShape
	if len(l.GetFilterChains()) != 1 {
		return s, fmt.Errorf("%d filter chains; want 1", len(l.GetFilterChains()))
	}
	fc := l.GetFilterChains()[0]
	if ts := fc.GetTransportSocket(); ts != nil {
		var ctx tlsv3.DownstreamTlsContext
		if err := ts.GetTypedConfig().UnmarshalTo(&ctx); err != nil {
			return s, err
		}
		s.TLS, s.RequireCert = true, ctx.GetRequireClientCertificate().GetValue()
		p := ctx.GetCommonTlsContext().GetTlsCertificateProviderInstance()
		s.Identity = p.GetInstanceName() + "/" + p.GetCertificateName()
	}
	var hcm hcmv3.HttpConnectionManager
	if err := fc.GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		return s, err
	}
	for _, f := range hcm.GetHttpFilters() {
		var r rbachttp.RBAC
		switch f.GetName() {
		case "envoy.filters.http.rbac.DENY":
			if err := f.GetTypedConfig().UnmarshalTo(&r); err != nil {
				return s, err
			}
			s.Deny = r.GetRules()
		case "envoy.filters.http.rbac":
			if err := f.GetTypedConfig().UnmarshalTo(&r); err != nil {
				return s, err
			}
			s.Allow = r.GetRules()
		}
	}
	return s, nil
}

// fetchInbound asks an xDS server (plaintext) for one inbound listener as
// node, on a stream of its own, and returns it (nil: not sent).
func fetchInbound(ctx context.Context, addr string, node *corev3.Node, name string) (*listenerv3.Listener, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := xdstest.Fetch(ctx, conn, &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ListenerType, ResourceNames: []string{name}})
	if err != nil {
		return nil, err
	}
	for _, r := range resp.GetResources() {
		var l listenerv3.Listener
		if err := r.UnmarshalTo(&l); err != nil {
			return nil, err
		}
		if l.GetName() == name {
			return &l, nil
		}
	}
	return nil, nil
}

// oracleCase is one workload and the policies that select it. want says
// how the hub's answer relates to istiod's: "" equal as protos; otherwise
// the difference, which check verifies on the hub's side.
type oracleCase struct {
	name   string
	labels map[string]string // besides app=<name>
	// ns is the case's namespace ("" the test's main one).
	ns       string
	policies []map[string]any // AuthorizationPolicy specs; selector app=<name> added
	peer     map[string]any   // a PeerAuthentication spec; selector app=<name> added unless nsWide
	nsWide   bool
	// strict says the listener requires client certificates (checked on
	// both, so that a PeerAuthentication neither has read yet cannot pass).
	strict bool
	diff   string // why the hub differs; "" none
	check  func(hub, istiod inboundShape) error
}

func rule(from, to, when any) map[string]any {
	r := map[string]any{}
	if from != nil {
		r["from"] = []any{map[string]any{"source": from}}
	}
	if to != nil {
		r["to"] = []any{map[string]any{"operation": to}}
	}
	if when != nil {
		r["when"] = when
	}
	return r
}

func policy(action string, rules ...map[string]any) map[string]any {
	p := map[string]any{"rules": toAny(rules)}
	if action != "" {
		p["action"] = action
	}
	return p
}

func toAny[T any](s []T) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

func strs(s ...string) []any { return toAny(s) }

// TestAuthorizationAsIstiodGRPCGen (issue 23): Istio as the oracle. For
// each case a workload (a pod, labelled app=<case>, behind a Service, as
// istiod needs it) is selected by its own AuthorizationPolicies or
// PeerAuthentication, in the home cluster, labelled for distribution. A
// real istiod (the e2e build, reading the same API server, root namespace
// and trust domain) and the hub are asked for the same proxy's inbound
// listener as a proxyless gRPC server asks (node metadata GENERATOR=grpc),
// and their RBAC filters and inbound TLS compared: the RBAC rules as
// protos, the TLS by whether there is one, whether it requires client
// certificates and the identity's certificate provider (the validation
// context's shape differs on purpose: istiod sends a
// combined_validation_context with grpc-go's deprecated fields, which
// Envoy's validation refuses, the hub the current fields alone; see
// xdsgen.commonTLSContext). Where the hub differs, the case says why and
// checks the hub's answer.
func TestAuthorizationAsIstiodGRPCGen(t *testing.T) {
	istiodBin(t)
	e := localcluster.Require(t, env)
	ctx := testContext(t)
	home := e.Cluster("primary")
	kc := client(t, home)
	ns, ns2, root := "orc-"+rand.String(5), "orcns-"+rand.String(5), "orcr-"+rand.String(5)
	for _, n := range []string{ns, ns2, root} {
		if err := localcluster.EnsureNamespace(ctx, kc, n); err != nil {
			t.Fatal(err)
		}
	}
	const port = 17070
	alice := "cluster.local/ns/" + ns + "/sa/alice"
	hasDenyRules := func(hub inboundShape, n int) error {
		if hub.Deny == nil || len(hub.Deny.GetPolicies()) != n {
			return fmt.Errorf("hub's DENY filter %v; want %d policies", hub.Deny, n)
		}
		return nil
	}
	cases := []oracleCase{
		{name: "principals", policies: []map[string]any{policy("", rule(map[string]any{"principals": strs(alice)}, nil, nil))}},
		{name: "principal-wildcards", policies: []map[string]any{policy("", rule(map[string]any{"principals": strs("*/ns/"+ns+"/sa/alice", "cluster.local/ns/other/*", "*")}, nil, nil))}},
		{name: "not-principals", policies: []map[string]any{policy("", rule(map[string]any{"notPrincipals": strs(alice)}, nil, nil))}},
		{name: "namespaces", policies: []map[string]any{policy("", rule(map[string]any{"namespaces": strs(ns, "team-*"), "notNamespaces": strs("team-x")}, nil, nil))}},
		{name: "service-accounts", policies: []map[string]any{policy("", rule(map[string]any{"serviceAccounts": strs("alice", "other/bob")}, nil, nil))}},
		{name: "trust-domains", policies: []map[string]any{policy("", rule(map[string]any{"trustDomains": strs("cluster.local", "*.example.org")}, nil, nil))}},
		{name: "ip-blocks", policies: []map[string]any{policy("", rule(map[string]any{"ipBlocks": strs("10.0.0.0/8", "192.168.1.1"), "notIpBlocks": strs("10.1.0.0/16")}, nil, nil))}},
		{name: "remote-ip-blocks", policies: []map[string]any{policy("", rule(map[string]any{"remoteIpBlocks": strs("172.16.0.0/12")}, nil, nil))}},
		{name: "request-principals", policies: []map[string]any{policy("", rule(map[string]any{"requestPrincipals": strs("https://issuer.example/alice", "*")}, nil, nil))}},
		{name: "paths", policies: []map[string]any{policy("", rule(nil, map[string]any{"paths": strs("/grpc.testing.TestService/UnaryCall", "/grpc.testing.TestService/*", "*Call")}, nil))}},
		{name: "not-paths", policies: []map[string]any{policy("", rule(nil, map[string]any{"notPaths": strs("/grpc.testing.TestService/EmptyCall")}, nil))}},
		{name: "methods-ports", policies: []map[string]any{policy("", rule(nil, map[string]any{"methods": strs("POST"), "ports": strs("17070"), "notPorts": strs("9090")}, nil))}},
		{name: "hosts", policies: []map[string]any{policy("", rule(nil, map[string]any{"hosts": strs("echo.example", "*.example.org"), "notHosts": strs("bad.example")}, nil))}},
		{name: "when-headers", policies: []map[string]any{policy("", rule(nil, nil, []any{
			map[string]any{"key": "request.headers[x-user]", "values": strs("alice", "bob*")},
			map[string]any{"key": "request.headers[x-tenant]", "notValues": strs("evil")}}))}},
		{name: "when-source-and-destination", policies: []map[string]any{policy("", rule(nil, nil, []any{
			map[string]any{"key": "source.ip", "values": strs("10.0.0.0/8")},
			map[string]any{"key": "source.namespace", "values": strs(ns)},
			map[string]any{"key": "source.principal", "values": strs(alice)},
			map[string]any{"key": "destination.port", "values": strs("17070")},
			map[string]any{"key": "destination.ip", "values": strs("10.250.0.0/16")}}))}},
		{name: "when-claims", policies: []map[string]any{policy("", rule(nil, nil, []any{
			map[string]any{"key": "request.auth.claims[groups]", "values": strs("admins")},
			map[string]any{"key": "request.auth.audiences", "values": strs("hub")}}))}},
		{name: "two-rules", policies: []map[string]any{policy("", rule(map[string]any{"principals": strs(alice)}, nil, nil), rule(nil, map[string]any{"paths": strs("/health")}, nil))}},
		{name: "deny-principals", policies: []map[string]any{policy("DENY", rule(map[string]any{"principals": strs(alice)}, nil, nil))}},
		{name: "deny-method", policies: []map[string]any{policy("DENY", rule(nil, map[string]any{"paths": strs("/grpc.testing.TestService/EmptyCall")}, nil))}},
		{name: "allow-and-deny", policies: []map[string]any{
			policy("", rule(map[string]any{"namespaces": strs(ns)}, nil, nil)),
			policy("DENY", rule(map[string]any{"notPrincipals": strs(alice)}, map[string]any{"paths": strs("/admin*")}, nil))}},
		{name: "audit", policies: []map[string]any{policy("AUDIT", rule(map[string]any{"principals": strs(alice)}, nil, nil))}},
		{name: "allow-nothing", policies: []map[string]any{{}},
			diff: "an ALLOW policy without rules allows nothing in Istio; istiod's grpcgen leaves the ALLOW filter out (allowing everything), the hub sends it with no policy (denying everything)",
			check: func(hub, istiod inboundShape) error {
				if istiod.Allow != nil || hub.Allow == nil || len(hub.Allow.GetPolicies()) != 0 || hub.Allow.GetAction() != rbacpb.RBAC_ALLOW {
					return fmt.Errorf("istiod ALLOW %v, hub ALLOW %v; want none and an empty ALLOW", istiod.Allow, hub.Allow)
				}
				return nil
			}},
		{name: "custom", policies: []map[string]any{{"action": "CUSTOM", "provider": map[string]any{"name": "opa"},
			"rules": []any{rule(nil, map[string]any{"paths": strs("/grpc.testing.TestService/EmptyCall")}, nil)}}},
			diff: "CUSTOM (an external authorizer) cannot be called by proxyless gRPC: istiod's grpcgen ignores the policy (failing open), the hub denies what its rules match (failing closed, as istiod's sidecar builder does for a provider it cannot use)",
			check: func(hub, istiod inboundShape) error {
				if istiod.Deny != nil {
					return fmt.Errorf("istiod sent a DENY filter for CUSTOM: %v", istiod.Deny)
				}
				return hasDenyRules(hub, 1)
			}},
		{name: "path-template-allow", policies: []map[string]any{policy("", rule(nil, map[string]any{"paths": strs("/grpc.testing.TestService/{*}")}, nil))},
			diff: "path templates become an RBAC uri_template, which grpc-go refuses (NACKing the whole listener, so the server stops serving): the hub drops the ALLOW rule (allowing less)",
			check: func(hub, istiod inboundShape) error {
				if hub.Allow == nil || len(hub.Allow.GetPolicies()) != 0 {
					return fmt.Errorf("hub ALLOW %v; want an ALLOW filter with the rule dropped", hub.Allow)
				}
				return nil
			}},
		{name: "grpc-header-deny", policies: []map[string]any{policy("DENY", rule(nil, nil, []any{map[string]any{"key": "request.headers[grpc-timeout]", "values": strs("1S")}}))},
			diff:  "grpc-go refuses header matchers on grpc- headers (gRFC A41, NACKing the listener): the hub widens the DENY to match any value of the condition",
			check: func(hub, istiod inboundShape) error { return hasDenyRules(hub, 1) }},
		{name: "peer-strict", strict: true, peer: map[string]any{"mtls": map[string]any{"mode": "STRICT"}}},
		{name: "peer-permissive", peer: map[string]any{"mtls": map[string]any{"mode": "PERMISSIVE"}}},
		{name: "peer-disable", peer: map[string]any{"mtls": map[string]any{"mode": "DISABLE"}}},
		{name: "peer-permissive-automtls", strict: true, labels: map[string]string{"security.istio.io/tlsMode": "istio"}, peer: map[string]any{"mtls": map[string]any{"mode": "PERMISSIVE"}}},
		{name: "peer-port-level", strict: true, peer: map[string]any{"mtls": map[string]any{"mode": "DISABLE"}, "portLevelMtls": map[string]any{fmt.Sprint(port): map[string]any{"mode": "STRICT"}}}},
		{name: "peer-namespace", strict: true, ns: ns2, nsWide: true, peer: map[string]any{"mtls": map[string]any{"mode": "STRICT"}},
			policies: []map[string]any{policy("", rule(map[string]any{"principals": strs(alice)}, nil, nil))}},
	}

	// The workloads: a pod each (no kubelet: its address set in status)
	// behind one Service per namespace whose target port is the servers'.
	for _, n := range []string{ns, ns2} {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: "default"}}
		if _, err := kc.CoreV1().ServiceAccounts(n).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: "oracle"}, Spec: corev1.ServiceSpec{
			Selector: map[string]string{"oracle": "true"},
			Ports:    []corev1.ServicePort{{Name: "grpc", Port: 7070, TargetPort: intstr.FromInt32(port)}},
		}}
		if _, err := kc.CoreV1().Services(n).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ipOf := func(i int) string { return fmt.Sprintf("10.250.%d.%d", i/200, i%200+1) }
	nodes := map[string]*corev3.Node{}
	for i, c := range cases {
		n := c.ns
		if n == "" {
			n = ns
		}
		labels := map[string]string{"app": c.name, "oracle": "true"}
		for k, v := range c.labels {
			labels[k] = v
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: c.name, Labels: labels},
			Spec: corev1.PodSpec{AutomountServiceAccountToken: new(false), ServiceAccountName: "default",
				Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app", Ports: []corev1.ContainerPort{{ContainerPort: port}}}}},
		}
		created, err := kc.CoreV1().Pods(n).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ipOf(i), PodIPs: []corev1.PodIP{{IP: ipOf(i)}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		if _, err := kc.CoreV1().Pods(n).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		md := map[string]any{"GENERATOR": "grpc", "NAMESPACE": n, "CLUSTER_ID": home.Name, "ISTIO_VERSION": "1.28.0"}
		lab := map[string]any{}
		for k, v := range labels {
			lab[k] = v
		}
		md["LABELS"] = lab
		st, err := structpb.NewStruct(md)
		if err != nil {
			t.Fatal(err)
		}
		nodes[c.name] = &corev3.Node{Id: fmt.Sprintf("sidecar~%s~%s.%s~%s.svc.cluster.local", ipOf(i), c.name, n, n), Metadata: st}
	}

	// The policies, labelled for distribution.
	installIstioCRDs(t, home)
	dyn, err := dynamic.NewForConfig(home.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	objs := istioObjects{t: t, dyn: dyn}
	for _, c := range cases {
		n := c.ns
		if n == "" {
			n = ns
		}
		sel := map[string]any{"matchLabels": map[string]any{"app": c.name}}
		for i, p := range c.policies {
			spec := map[string]any{"selector": sel}
			for k, v := range p {
				spec[k] = v
			}
			objs.apply(authorizationPolicies, n, fmt.Sprintf("%s-%d", c.name, i), spec)
		}
		if c.peer != nil {
			spec := map[string]any{}
			for k, v := range c.peer {
				spec[k] = v
			}
			if !c.nsWide {
				spec["selector"] = sel
			}
			objs.apply(peerAuthentications, n, c.name, spec)
		}
	}

	istiod := startIstiod(t, home, istiodOptions{SystemNamespace: root})
	h := startHub(t, home, "--namespace", hubNamespace(t, home), "--root-namespace", root, "--trust-domain", "cluster.local",
		"--distribute-namespaces", strings.Join([]string{root, ns, ns2}, ","))

	name := fmt.Sprintf("xds.istio.io/grpc/lds/inbound/0.0.0.0:%d", port)
	var diffs []string
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			eventually(t, 90*time.Second, func() error {
				fromIstiod, err := fetchInbound(ctx, istiod.XDSAddr, nodes[c.name], name)
				if err != nil || fromIstiod == nil {
					return fmt.Errorf("istiod: %v, %v", fromIstiod, err)
				}
				fromHub, err := fetchInbound(ctx, h.xdsAddr, nodes[c.name], name)
				if err != nil || fromHub == nil {
					return fmt.Errorf("hub: %v, %v", fromHub, err)
				}
				is, err := shapeOf(fromIstiod)
				if err != nil {
					return fmt.Errorf("istiod's listener: %v", err)
				}
				hs, err := shapeOf(fromHub)
				if err != nil {
					return fmt.Errorf("hub's listener: %v", err)
				}
				if len(c.policies) > 0 && !c.expectsNothing() && is.Allow == nil && is.Deny == nil {
					return fmt.Errorf("istiod has no RBAC filter yet")
				}
				if is.RequireCert != c.strict || hs.RequireCert != c.strict {
					return fmt.Errorf("client certificates required: istiod %v, hub %v; want %v", is.RequireCert, hs.RequireCert, c.strict)
				}
				d := is.diff(hs)
				if c.diff == "" {
					if d != "" {
						return fmt.Errorf("hub differs from istiod:\n%s", d)
					}
					return nil
				}
				if d == "" {
					return fmt.Errorf("hub equals istiod; want the difference: %s", c.diff)
				}
				return c.check(hs, is)
			})
		})
		if c.diff != "" {
			diffs = append(diffs, c.name+": "+c.diff)
		}
	}
	t.Logf("%d cases, %d differences from istiod, each on purpose:\n  %s", len(cases), len(diffs), strings.Join(diffs, "\n  "))

	// What the hub enforces other than Istio means it is reported per
	// policy: in the API and as a Warning Event on the object.
	noted := []string{ns + "/custom-0", ns + "/path-template-allow-0", ns + "/grpc-header-deny-0"}
	eventually(t, 30*time.Second, func() error {
		var st distribute.Status
		h.getJSON(t, "/api/v1/distribution", &st)
		got := map[string]bool{}
		for _, k := range st.Kinds {
			for _, n := range k.Notes {
				got[n.Object] = true
			}
		}
		for _, o := range noted {
			if !got[o] {
				return fmt.Errorf("no note on %s in /api/v1/distribution: %+v", o, got)
			}
		}
		evs, err := kc.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + distribute.NoteReason})
		if err != nil {
			return err
		}
		for _, o := range noted {
			found := false
			for _, ev := range evs.Items {
				found = found || (ev.InvolvedObject.Namespace+"/"+ev.InvolvedObject.Name == o && ev.Type == corev1.EventTypeWarning)
			}
			if !found {
				return fmt.Errorf("no Warning Event %s on %s", distribute.NoteReason, o)
			}
		}
		return nil
	})
}

// expectsNothing reports whether istiod sends no RBAC filter for the case
// even once it holds its policies (AUDIT, ALLOW without rules, CUSTOM,
// PeerAuthentication only).
func (c oracleCase) expectsNothing() bool {
	for _, p := range c.policies {
		switch p["action"] {
		case "AUDIT", "CUSTOM":
			return true
		}
		if _, ok := p["rules"]; !ok {
			return true
		}
	}
	return false
}
