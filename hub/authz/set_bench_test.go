package authz

import (
	"fmt"
	"testing"

	"github.com/hubmesh/hub/distribute"
)

// benchSet is 1,000 AuthorizationPolicies (ALLOW, one principal rule,
// selecting app=app-<i%10>) and 100 PeerAuthentications over 100
// namespaces, with 10 mesh-wide DENY policies.
func benchSet(b *testing.B) *Set {
	b.Helper()
	authz, peers := benchObjects()
	return NewSet(root, Permissive, TrustDomainBundle{TrustDomains: []string{"cluster.local"}}, authz, peers)
}

// benchObjects are benchSet's policies.
func benchObjects() (authz, peers []distribute.Object) {
	for i := range 1000 {
		ns := fmt.Sprint("ns-", i%100)
		authz = append(authz, obj(ns, fmt.Sprint("p-", i), i, allow(map[string]string{"app": fmt.Sprint("app-", i%10)}, "cluster.local/ns/"+ns+"/sa/caller")))
	}
	for i := range 10 {
		authz = append(authz, obj(root, fmt.Sprint("mesh-deny-", i), i, denyPolicy(fmt.Sprint("cluster.local/ns/bad-", i, "/sa/x"))))
	}
	for i := range 100 {
		peers = append(peers, obj(fmt.Sprint("ns-", i), "strict", i, pa(strict, nil, nil)))
	}
	return authz, peers
}

// BenchmarkNewSet: compiling every policy, what each policy change costs
// once per push.
func BenchmarkNewSet(b *testing.B) {
	for b.Loop() {
		benchSet(b)
	}
}

// BenchmarkSelectKey: what a policy change costs per kind of server (the
// watcher compares keys before and after).
func BenchmarkSelectKey(b *testing.B) {
	s := benchSet(b)
	w := Workload{Namespace: "ns-7", Labels: map[string]string{"app": "app-7", "version": "v1"}}
	for b.Loop() {
		_ = s.Select(w).Key()
	}
}

// BenchmarkSelectionRBAC: building a server's RBAC filters (once per
// kind of server and change; the inbound listener is then memoised).
func BenchmarkSelectionRBAC(b *testing.B) {
	s := benchSet(b)
	sel := s.Select(Workload{Namespace: "ns-7", Labels: map[string]string{"app": "app-7"}})
	for b.Loop() {
		_, _ = sel.RBAC()
	}
}

// BenchmarkNextSetOneEdit: a set after one policy changed, reusing the
// others' compilation (what the hub does on each policy edit).
func BenchmarkNextSetOneEdit(b *testing.B) {
	prev := benchSet(b)
	authz, peers := benchObjects()
	authz[0].Version = "v2"
	td := TrustDomainBundle{TrustDomains: []string{"cluster.local"}}
	for b.Loop() {
		NextSet(prev, root, Permissive, td, authz, peers)
	}
}
