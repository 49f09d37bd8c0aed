package sds

import (
	"errors"
	"testing"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/authn"
	"github.com/hubmesh/hub/hub/feed"
)

func TestParseName(t *testing.T) {
	key := func(ns, name string) clusters.ServiceKey { return clusters.ServiceKey{Namespace: ns, Name: name} }
	for _, c := range []struct {
		name string
		want Name
	}{
		{"ROOTCA", Name{Roots: true, WellFormed: true}},
		{"default", Name{Roots: true, WellFormed: true}},
		{"spiffe://peer.example", Name{Roots: true, WellFormed: true}},
		{"kubernetes://gw", Name{Key: key("a", "gw"), WellFormed: true}},
		{"gw", Name{Key: key("a", "gw"), WellFormed: true}},
		{"kubernetes://b/gw", Name{Key: key("b", "gw"), WellFormed: true}},
		{"kubernetes://gw-cacert", Name{Key: key("a", "gw"), CAOnly: true, CAKey: key("a", "gw-cacert"), WellFormed: true}},
		// A lister asked for namespace "" reads the name as a key: refused.
		{"kubernetes:///gw", Name{Key: key("", "gw")}},
		{"kubernetes://b/c/gw", Name{Key: key("b", "c/gw")}},
		{"kubernetes://B/gw", Name{Key: key("B", "gw")}},
	} {
		if got := ParseName(c.name, "a"); got != c.want {
			t.Errorf("ParseName(%q, a) = %+v; want %+v", c.name, got, c.want)
		}
	}
}

type roots struct{}

func (roots) LocalTrustDomain() string { return "mesh.local" }
func (roots) RootsPEM(td string) ([]byte, bool) {
	return []byte("ROOTS-" + td), td == "mesh.local"
}

type secrets map[clusters.ServiceKey]*clusters.TLSSecret

func (s secrets) TLSSecret(cluster string, key clusters.ServiceKey) (*clusters.TLSSecret, error) {
	if cluster != "west" || s[key] == nil {
		return nil, clusters.ErrSecretNotFound
	}
	return s[key], nil
}

type reviews map[string]error // namespace → nil (allowed), ErrDenied or ErrReviewPending

func (r reviews) Decide(k feed.ReviewKey) (bool, error) {
	err, ok := r[k.Namespace]
	if errors.Is(err, ErrDenied) {
		return false, nil
	}
	return ok && err == nil, err
}

// Secret decides each name as istiod does, and says why not with an error
// the watcher can tell apart (denied, pending, transient).
func TestSecret(t *testing.T) {
	store := secrets{
		{Namespace: "a", Name: "gw"}:        {Cert: []byte("C"), Key: []byte("K"), CA: []byte("CA")},
		{Namespace: "a", Name: "cacerts"}:   {Cert: []byte("C"), Key: []byte("K")},
		{Namespace: "b", Name: "gw"}:        {Cert: []byte("C"), Key: []byte("K")},
		{Namespace: "c", Name: "gw"}:        {Cert: []byte("C"), Key: []byte("K")},
		{Namespace: "hub", Name: "gw"}:      {Cert: []byte("C"), Key: []byte("K")},
		{Namespace: "a", Name: "ca-cacert"}: {CA: []byte("ONLY-CA")},
	}
	g := New(roots{}, store, nil, reviews{"b": nil, "c": ErrReviewPending, "d": ErrDenied}, "hub")
	id := authn.Identity{SpiffeID: spiffeid.RequireFromString("spiffe://mesh.local/ns/a/sa/gw"), Namespace: "a", Cluster: "west"}
	for _, c := range []struct {
		name    string
		id      authn.Identity
		want    string // the secret's certificate, CA or roots
		err     error  // errors.Is
		review  bool   // an access review was consulted
		anyFail bool   // some error, of no particular kind
	}{
		{name: "ROOTCA", id: id, want: "ROOTS-mesh.local"},
		{name: "spiffe://peer.example", id: id, anyFail: true},
		{name: "kubernetes://gw", id: id, want: "C"},
		{name: "kubernetes://gw-cacert", id: id, want: "CA"},
		{name: "kubernetes://ca-cacert", id: id, want: "ONLY-CA"},
		{name: "kubernetes://b/gw", id: id, want: "C", review: true},
		{name: "kubernetes://c/gw", id: id, err: ErrReviewPending, review: true},
		{name: "kubernetes://d/gw", id: id, err: ErrDenied, review: true},
		{name: "kubernetes://cacerts", id: id, err: ErrDenied},
		{name: "kubernetes://hub/gw", id: id, err: ErrDenied},
		{name: "kubernetes:///gw", id: id, err: ErrDenied},
		{name: "kubernetes://missing", id: id, err: clusters.ErrSecretNotFound},
		{name: "default", id: id, err: ErrDenied}, // the workload certificate is the watcher's
		{name: "kubernetes://gw", id: authn.Identity{}, err: ErrDenied},
		{name: "kubernetes://gw", id: authn.Identity{SpiffeID: id.SpiffeID, Namespace: "a"}, err: ErrDenied},
		{name: "kubernetes://gw", id: authn.Identity{SpiffeID: id.SpiffeID, Namespace: "a", Cluster: "west", Conflict: "east"}, err: ErrDenied},
	} {
		msg, review, err := g.Secret(c.id, c.name)
		switch {
		case c.anyFail || c.err != nil:
			if err == nil || (c.err != nil && !errors.Is(err, c.err)) {
				t.Errorf("%s as %v: %v; want %v", c.name, c.id.SpiffeID, err, c.err)
			}
		case err != nil:
			t.Errorf("%s: %v", c.name, err)
		default:
			s := msg.(*tlsv3.Secret)
			got := string(s.GetTlsCertificate().GetCertificateChain().GetInlineBytes()) + string(s.GetValidationContext().GetTrustedCa().GetInlineBytes())
			if got != c.want || s.Name != c.name {
				t.Errorf("%s: secret %s holds %q; want %q", c.name, s.Name, got, c.want)
			}
		}
		if (review != nil) != c.review {
			t.Errorf("%s: consulted review %v; want one: %v", c.name, review, c.review)
		}
	}
	if Transient(ErrReviewPending) != true || Transient(ErrDenied) || Transient(clusters.ErrSecretNotFound) {
		t.Error("Transient: a pending review comes back by itself; a denial and a missing Secret do not")
	}
	if _, _, err := New(nil, nil, nil, nil, "").Secret(id, "ROOTCA"); err == nil {
		t.Error("a hub without roots or secrets served ROOTCA")
	}
	var none *Generator
	if _, _, err := none.Secret(id, "ROOTCA"); err == nil {
		t.Error("no generator served ROOTCA")
	}
}
