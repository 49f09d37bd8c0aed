package authz

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rbacpb "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1beta1 "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"

	"github.com/hubmesh/hub/distribute"
)

const root = "istio-system"

func obj(ns, name string, age int, spec any) distribute.Object {
	o := distribute.Object{Namespace: ns, Name: name, Version: "v1", CreationTimestamp: time.Unix(int64(1000-age), 0)}
	switch s := spec.(type) {
	case *securityv1beta1.PeerAuthentication:
		o.Kind, o.Spec = PeerAuthenticationKind, s
	case *securityv1beta1.AuthorizationPolicy:
		o.Kind, o.Spec = AuthorizationPolicyKind, s
	}
	return o
}

func pa(mode securityv1beta1.PeerAuthentication_MutualTLS_Mode, labels map[string]string, ports map[uint32]securityv1beta1.PeerAuthentication_MutualTLS_Mode) *securityv1beta1.PeerAuthentication {
	p := &securityv1beta1.PeerAuthentication{Mtls: &securityv1beta1.PeerAuthentication_MutualTLS{Mode: mode}}
	if labels != nil {
		p.Selector = &typev1beta1.WorkloadSelector{MatchLabels: labels}
	}
	if ports != nil {
		p.PortLevelMtls = map[uint32]*securityv1beta1.PeerAuthentication_MutualTLS{}
		for port, m := range ports {
			p.PortLevelMtls[port] = &securityv1beta1.PeerAuthentication_MutualTLS{Mode: m}
		}
	}
	return p
}

const (
	unset      = securityv1beta1.PeerAuthentication_MutualTLS_UNSET
	strict     = securityv1beta1.PeerAuthentication_MutualTLS_STRICT
	permissive = securityv1beta1.PeerAuthentication_MutualTLS_PERMISSIVE
	disable    = securityv1beta1.PeerAuthentication_MutualTLS_DISABLE
)

// TestPeerAuthenticationModes: mesh → namespace → workload, UNSET
// inheriting, the oldest of a level winning, portLevelMtls of the workload
// policy last, and the rendering of PERMISSIVE (plaintext, or STRICT for a
// workload labelled security.istio.io/tlsMode=istio), as istiod's
// ComposePeerAuthentication and grpcgen do.
func TestPeerAuthenticationModes(t *testing.T) {
	echo := Workload{Namespace: "app", Labels: map[string]string{"app": "echo"}}
	cases := []struct {
		name        string
		meshDefault Mode
		peers       []distribute.Object
		w           Workload
		port        uint32
		policy      Mode
		served      Mode
	}{
		{"no policy: the flag's default", Permissive, nil, echo, 8080, Permissive, Disable},
		{"no policy, STRICT default", Strict, nil, echo, 8080, Strict, Strict},
		{"mesh STRICT", Permissive, []distribute.Object{obj(root, "mesh", 1, pa(strict, nil, nil))}, echo, 8080, Strict, Strict},
		{"mesh UNSET keeps the default", Strict, []distribute.Object{obj(root, "mesh", 1, pa(unset, nil, nil))}, echo, 8080, Strict, Strict},
		{"namespace over mesh", Permissive, []distribute.Object{obj(root, "mesh", 1, pa(strict, nil, nil)), obj("app", "ns", 1, pa(disable, nil, nil))}, echo, 8080, Disable, Disable},
		{"another namespace's policy does not apply", Permissive, []distribute.Object{obj("other", "ns", 1, pa(strict, nil, nil))}, echo, 8080, Permissive, Disable},
		{"workload over namespace", Permissive, []distribute.Object{obj("app", "ns", 1, pa(strict, nil, nil)), obj("app", "wl", 1, pa(disable, map[string]string{"app": "echo"}, nil))}, echo, 8080, Disable, Disable},
		{"workload selector not matching", Permissive, []distribute.Object{obj("app", "wl", 1, pa(strict, map[string]string{"app": "other"}, nil))}, echo, 8080, Permissive, Disable},
		{"workload UNSET inherits the namespace's", Permissive, []distribute.Object{obj("app", "ns", 1, pa(strict, nil, nil)), obj("app", "wl", 1, pa(unset, map[string]string{"app": "echo"}, nil))}, echo, 8080, Strict, Strict},
		{"port level", Permissive, []distribute.Object{obj("app", "wl", 1, pa(disable, map[string]string{"app": "echo"}, map[uint32]securityv1beta1.PeerAuthentication_MutualTLS_Mode{8080: strict}))}, echo, 8080, Strict, Strict},
		{"port level of another port", Permissive, []distribute.Object{obj("app", "wl", 1, pa(disable, map[string]string{"app": "echo"}, map[uint32]securityv1beta1.PeerAuthentication_MutualTLS_Mode{9090: strict}))}, echo, 8080, Disable, Disable},
		{"port level UNSET inherits", Permissive, []distribute.Object{obj("app", "wl", 1, pa(strict, map[string]string{"app": "echo"}, map[uint32]securityv1beta1.PeerAuthentication_MutualTLS_Mode{8080: unset}))}, echo, 8080, Strict, Strict},
		{"oldest namespace policy wins", Permissive, []distribute.Object{obj("app", "new", 1, pa(disable, nil, nil)), obj("app", "old", 9, pa(strict, nil, nil))}, echo, 8080, Strict, Strict},
		{"root namespace selector policy is ignored", Permissive, []distribute.Object{obj(root, "sel", 1, pa(strict, map[string]string{"app": "echo"}, nil))}, echo, 8080, Permissive, Disable},
		{"PERMISSIVE with the tlsMode label is served STRICT", Permissive, nil, Workload{Namespace: "app", Labels: map[string]string{"security.istio.io/tlsMode": "istio"}}, 8080, Permissive, Strict},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sel := NewSet(root, tc.meshDefault, TrustDomainBundle{}, nil, tc.peers).Select(tc.w)
			if got := sel.PolicyMode(tc.port); got != tc.policy {
				t.Errorf("PolicyMode = %s; want %s", got, tc.policy)
			}
			if got := sel.ServerMode(tc.port); got != tc.served {
				t.Errorf("ServerMode = %s; want %s", got, tc.served)
			}
		})
	}
}

func TestMeshMode(t *testing.T) {
	if m := NewSet(root, Permissive, TrustDomainBundle{}, nil, nil).MeshMode(); m != Permissive {
		t.Errorf("no policy: %s", m)
	}
	s := NewSet(root, Permissive, TrustDomainBundle{}, nil, []distribute.Object{obj(root, "b", 1, pa(disable, nil, nil)), obj(root, "a", 5, pa(strict, nil, nil)), obj("app", "ns", 9, pa(disable, nil, nil))})
	if m := s.MeshMode(); m != Strict {
		t.Errorf("the oldest root-namespace policy without selector is STRICT; MeshMode = %s", m)
	}
}

func allow(labels map[string]string, principals ...string) *securityv1beta1.AuthorizationPolicy {
	p := &securityv1beta1.AuthorizationPolicy{Rules: []*securityv1beta1.Rule{{From: []*securityv1beta1.Rule_From{{Source: &securityv1beta1.Source{Principals: principals}}}}}}
	if labels != nil {
		p.Selector = &typev1beta1.WorkloadSelector{MatchLabels: labels}
	}
	return p
}

// TestAuthorizationPolicySelection: the root namespace's policies apply
// in every namespace, the others in theirs; selectors select by labels;
// targetRefs never attach a policy to a workload; DENY and CUSTOM make the
// DENY filter, ALLOW the ALLOW filter (present even with no rule: allow
// nothing), AUDIT neither.
func TestAuthorizationPolicySelection(t *testing.T) {
	deny := allow(nil, "x/ns/y/sa/z")
	deny.Action = securityv1beta1.AuthorizationPolicy_DENY
	custom := allow(nil, "x/ns/y/sa/c")
	custom.Action = securityv1beta1.AuthorizationPolicy_CUSTOM
	custom.ActionDetail = &securityv1beta1.AuthorizationPolicy_Provider{Provider: &securityv1beta1.AuthorizationPolicy_ExtensionProvider{Name: "opa"}}
	audit := allow(nil, "x/ns/y/sa/a")
	audit.Action = securityv1beta1.AuthorizationPolicy_AUDIT
	targeted := allow(nil, "x/ns/y/sa/t")
	targeted.TargetRefs = []*typev1beta1.PolicyTargetReference{{Kind: "Gateway", Name: "gw"}}
	s := NewSet(root, Permissive, TrustDomainBundle{}, []distribute.Object{
		obj(root, "mesh-allow", 1, allow(nil, "x/ns/y/sa/mesh")),
		obj("app", "echo-only", 1, allow(map[string]string{"app": "echo"}, "x/ns/y/sa/echo")),
		obj("app", "deny", 1, deny),
		obj("app", "custom", 1, custom),
		obj("app", "audit", 1, audit),
		obj("app", "targeted", 1, targeted),
		obj("other", "elsewhere", 1, allow(nil, "x/ns/y/sa/other")),
	}, nil)
	sel := s.Select(Workload{Namespace: "app", Labels: map[string]string{"app": "echo"}})
	a := sel.Policies()
	if want := []string{"app/echo-only", "istio-system/mesh-allow"}; !sameSet(a.Allow, want) {
		t.Errorf("ALLOW %v; want %v", a.Allow, want)
	}
	if !slices.Equal(a.Deny, []string{"app/deny"}) || !slices.Equal(a.Custom, []string{"app/custom"}) || !slices.Equal(a.Audit, []string{"app/audit"}) {
		t.Errorf("DENY %v, CUSTOM %v, AUDIT %v", a.Deny, a.Custom, a.Audit)
	}
	d, al := sel.RBAC()
	if d == nil || d.Action != rbacpb.RBAC_DENY || len(d.Policies) != 2 || d.Policies["app-deny-0"] == nil || d.Policies["app-custom-0"] == nil {
		t.Errorf("DENY filter %v; want app-deny-0 and app-custom-0", d)
	}
	if al == nil || al.Action != rbacpb.RBAC_ALLOW || len(al.Policies) != 2 {
		t.Errorf("ALLOW filter %v; want two policies", al)
	}
	other := s.Select(Workload{Namespace: "app", Labels: map[string]string{"app": "web"}}).Policies()
	if !slices.Equal(other.Allow, []string{"istio-system/mesh-allow"}) {
		t.Errorf("web's ALLOW %v; want only the mesh-wide one", other.Allow)
	}
	if sel.Key() == s.Select(Workload{Namespace: "app", Labels: map[string]string{"app": "web"}}).Key() {
		t.Error("different policies, same key")
	}
	var custProblem bool
	for _, p := range s.Problems() {
		if p.Policy == "app/custom" {
			custProblem = true
		}
	}
	if !custProblem {
		t.Errorf("no problem reported for the CUSTOM policy: %v", s.Problems())
	}

	// An ALLOW policy without rules allows nothing: the filter is there,
	// empty.
	empty := NewSet(root, Permissive, TrustDomainBundle{}, []distribute.Object{obj("app", "nothing", 1, &securityv1beta1.AuthorizationPolicy{})}, nil)
	if _, al := empty.Select(Workload{Namespace: "app"}).RBAC(); al == nil || len(al.Policies) != 0 {
		t.Errorf("allow-nothing: ALLOW filter %v; want one with no policy", al)
	}
	if d, al := NewSet(root, Permissive, TrustDomainBundle{}, nil, nil).Select(Workload{Namespace: "app"}).RBAC(); d != nil || al != nil {
		t.Errorf("no policy: filters %v %v; want none", d, al)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// TestWorkloadOf: node metadata, held to the proven identity; labels past
// what the hub reads make the workload Truncated.
func TestWorkloadOf(t *testing.T) {
	md, err := structpb.NewStruct(map[string]any{
		"NAMESPACE": "other", "SERVICE_ACCOUNT": "root", "CLUSTER_ID": "east",
		"LABELS": map[string]any{"app": "echo", "version": "v1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	node := &corev3.Node{Id: "sidecar~10.0.0.1~echo-0.app~app.svc.cluster.local", Metadata: md}
	w := WorkloadOf(node, Proven{})
	if w.Namespace != "other" || w.ServiceAccount != "root" || w.Member != "east" || w.Verified || len(w.Labels) != 2 || w.Truncated {
		t.Errorf("unverified: %+v", w)
	}
	w = WorkloadOf(node, Proven{Verified: true, Namespace: "app", ServiceAccount: "echo", Member: "west"})
	if w.Namespace != "app" || w.ServiceAccount != "echo" || w.Member != "west" || !w.Verified || w.Claimed != "other" {
		t.Errorf("verified: %+v", w)
	}
	if w := WorkloadOf(node, Proven{Verified: true}); w.Namespace != "" || !w.Verified {
		t.Errorf("an identity without a namespace keeps the node's: %+v", w)
	}
	if w := WorkloadOf(&corev3.Node{Id: node.Id}, Proven{}); w.Namespace != "app" {
		t.Errorf("namespace from the node ID: %+v", w)
	}

	many := map[string]any{}
	for i := range MaxLabels + 1 {
		many[fmt.Sprint("l", i)] = "v"
	}
	big := map[string]any{"big": strings.Repeat("x", MaxLabelBytes)}
	for name, labels := range map[string]any{"too many": many, "too large": big, "not a string": map[string]any{"n": 3.0}, "not a map": "app=echo"} {
		md, err := structpb.NewStruct(map[string]any{"NAMESPACE": "app", "LABELS": labels})
		if err != nil {
			t.Fatal(err)
		}
		if w := WorkloadOf(&corev3.Node{Metadata: md}, Proven{}); !w.Truncated {
			t.Errorf("%s: not Truncated: %+v", name, w)
		}
		trimmed := TrimLabels(md.Fields["LABELS"])
		if w := WorkloadOf(&corev3.Node{Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"LABELS": trimmed}}}, Proven{}); !w.Truncated {
			t.Errorf("%s: trimmed labels are not Truncated", name)
		}
	}
}

// TestFailClosed: a workload whose labels were not all read, and the
// servers an unreadable policy could select, deny every request and
// require mTLS; a policy cannot erase another's rule by a colliding name.
func TestFailClosed(t *testing.T) {
	s := NewSet(root, Permissive, TrustDomainBundle{}, []distribute.Object{
		{Kind: AuthorizationPolicyKind, Namespace: "app", Name: "broken", Version: "unreadable/1"},
		obj(root, "deny", 1, denyPolicy("x/ns/y/sa/mesh")),
		obj("istio", "system-deny", 1, denyPolicy("x/ns/y/sa/ns")),
	}, []distribute.Object{{Kind: PeerAuthenticationKind, Namespace: "app", Name: "broken-peer", Version: "unreadable/1"}})
	sel := s.Select(Workload{Namespace: "app"})
	if sel.ServerMode(8080) != Strict {
		t.Error("an unreadable PeerAuthentication of the namespace: not STRICT")
	}
	if d, _ := sel.RBAC(); d == nil || d.Policies["app-broken-unreadable"] == nil {
		t.Errorf("an unreadable AuthorizationPolicy of the namespace: DENY filter %v", d)
	}
	if other := s.Select(Workload{Namespace: "web"}); other.ServerMode(8080) != Disable {
		t.Error("another namespace's server failed closed on app's unreadable policies")
	}
	if n := len(s.Problems()); n < 2 {
		t.Errorf("%d problems; want the unreadable policies reported", n)
	}

	tr := s.Select(Workload{Namespace: "web", Truncated: true})
	if d, a := tr.RBAC(); tr.ServerMode(8080) != Strict || d == nil || len(d.Policies) != 1 || a != nil {
		t.Errorf("truncated labels: mode %s, DENY %v, ALLOW %v; want STRICT, deny all", tr.ServerMode(8080), d, a)
	}

	// An action the hub does not know denies everything in its scope; an
	// unreadable root PeerAuthentication makes the mesh (clients too)
	// STRICT.
	future := allow(nil, "x/ns/y/sa/a")
	future.Action = securityv1beta1.AuthorizationPolicy_Action(42)
	fs := NewSet(root, Permissive, TrustDomainBundle{}, []distribute.Object{obj("app", "future", 1, future)},
		[]distribute.Object{{Kind: PeerAuthenticationKind, Namespace: root, Name: "broken", Version: "unreadable/1"}})
	if d, _ := fs.Select(Workload{Namespace: "app"}).RBAC(); d == nil || d.Policies["app-future-unreadable"] == nil {
		t.Errorf("unknown action: DENY filter %v; want deny-all", d)
	}
	if fs.MeshMode() != Strict || fs.Select(Workload{Namespace: "web"}).FailsClosed() == "" {
		t.Errorf("unreadable root PeerAuthentication: mesh mode %s; want STRICT, and every server failing closed", fs.MeshMode())
	}

	// Labels that would join into the same string are different keys.
	a := Workload{Namespace: "app", Labels: map[string]string{"app": "web", "tier": "front"}}
	b := Workload{Namespace: "app", Labels: map[string]string{"app": "web\x00tier=front"}}
	if a.LabelsKey() == b.LabelsKey() {
		t.Error("two label sets share a key")
	}

	// "istio-system/deny" and "istio/system-deny" both name their rule
	// "istio-system-deny-0": both are kept.
	if d, _ := s.Select(Workload{Namespace: "istio"}).RBAC(); d == nil || len(d.Policies) != 2 {
		t.Errorf("colliding rule names: DENY %v; want both rules", d)
	}
}

func denyPolicy(principals ...string) *securityv1beta1.AuthorizationPolicy {
	p := allow(nil, principals...)
	p.Action = securityv1beta1.AuthorizationPolicy_DENY
	return p
}

// TestNextSetReusesUnchangedPolicies: a policy whose version did not
// change is not compiled again; an edited one is.
func TestNextSetReusesUnchangedPolicies(t *testing.T) {
	a, b := obj("app", "a", 1, allow(nil, "x/ns/y/sa/a")), obj("app", "b", 1, allow(nil, "x/ns/y/sa/b"))
	prev := NewSet(root, Permissive, TrustDomainBundle{}, []distribute.Object{a, b}, nil)
	b2 := obj("app", "b", 1, allow(nil, "x/ns/y/sa/b2"))
	b2.Version = "v2"
	next := NextSet(prev, root, Permissive, TrustDomainBundle{}, []distribute.Object{a, b2}, nil)
	if next.byID["app/a"] != prev.byID["app/a"] {
		t.Error("the unchanged policy was compiled again")
	}
	if next.byID["app/b"] == prev.byID["app/b"] {
		t.Fatal("the edited policy was not compiled again")
	}
	_, al := next.Select(Workload{Namespace: "app"}).RBAC()
	if got := al.Policies["app-b-0"].GetPrincipals()[0].String(); !strings.Contains(got, "x/ns/y/sa/b2") {
		t.Errorf("the edited policy's rule: %s", got)
	}
}
