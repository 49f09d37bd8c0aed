package authz

import (
	"slices"
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

// TestWorkloadOf: node metadata, held to the proven identity.
func TestWorkloadOf(t *testing.T) {
	md, err := structpb.NewStruct(map[string]any{
		"NAMESPACE": "other", "SERVICE_ACCOUNT": "root", "CLUSTER_ID": "east",
		"LABELS": map[string]any{"app": "echo", "version": "v1", "n": 3.0},
	})
	if err != nil {
		t.Fatal(err)
	}
	node := &corev3.Node{Id: "sidecar~10.0.0.1~echo-0.app~app.svc.cluster.local", Metadata: md}
	w := WorkloadOf(node, Proven{})
	if w.Namespace != "other" || w.ServiceAccount != "root" || w.Member != "east" || w.Verified || len(w.Labels) != 2 {
		t.Errorf("unverified: %+v", w)
	}
	w = WorkloadOf(node, Proven{Namespace: "app", ServiceAccount: "echo", Member: "west"})
	if w.Namespace != "app" || w.ServiceAccount != "echo" || w.Member != "west" || !w.Verified || w.Claimed != "other" {
		t.Errorf("verified: %+v", w)
	}
	if w := WorkloadOf(&corev3.Node{Id: node.Id}, Proven{}); w.Namespace != "app" {
		t.Errorf("namespace from the node ID: %+v", w)
	}
}
