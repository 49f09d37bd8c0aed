package web

import (
	"strings"
	"testing"
	"time"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/internal/expiry"
	"github.com/hubmesh/hub/trust"
)

// expiringModels has members whose credentials are inside the warning
// window, past it, and outside it, and one whose token cannot be read.
type expiringModels struct {
	fakeModels
	now time.Time
}

func (m expiringModels) Clusters() []clusters.Status {
	day := 24 * time.Hour
	return []clusters.Status{
		{ID: "primary", State: clusters.StateReady},
		{ID: "soon", Secret: "istio-system/s", State: clusters.StateReady, Credentials: []clusters.CredentialExpiry{
			{Credential: clusters.CredentialToken, NotAfter: m.now.Add(3*day - time.Hour), Level: expiry.Expiring}}},
		{ID: "gone", Secret: "istio-system/s", State: clusters.StateUnreachable, Credentials: []clusters.CredentialExpiry{
			{Credential: clusters.CredentialClientCertificate, NotAfter: m.now.Add(-time.Hour), Level: expiry.Expired}}},
		{ID: "later", Secret: "istio-system/s", State: clusters.StateReady, Credentials: []clusters.CredentialExpiry{
			{Credential: clusters.CredentialToken, NotAfter: m.now.Add(30 * day), Level: expiry.Valid}}},
		{ID: "garbled", Secret: "istio-system/s", State: clusters.StateReady, Credentials: []clusters.CredentialExpiry{
			{Credential: clusters.CredentialToken, Error: "the bearer token is a JWT whose payload is not a JSON object"}}},
	}
}

func (m expiringModels) Cluster(id string) (clusters.Status, bool) {
	for _, st := range m.Clusters() {
		if st.ID == id {
			return st, true
		}
	}
	return clusters.Status{}, false
}

type expiringTrust struct{ now time.Time }

func (t expiringTrust) TrustDomains() []trust.Status {
	return []trust.Status{
		{Spec: trust.PeerSpec{TrustDomain: "local.example"}, Local: true, State: trust.StateReady, CA: &trust.CAExpiry{
			Root:   trust.CertExpiry{Subject: "CN=hub root", NotAfter: t.now.Add(3650 * 24 * time.Hour), Level: expiry.Valid},
			Chain:  trust.CertExpiry{Subject: "CN=hub intermediate", NotAfter: t.now.Add(3*24*time.Hour + time.Hour), Level: expiry.Expiring},
			Secret: "hub-system/cacerts"}},
		{Spec: trust.PeerSpec{TrustDomain: "peer.example", BundleEndpointURL: "https://peer"}, State: trust.StateStale,
			BundleExpiry: trust.CertExpiry{Subject: "CN=peer root", NotAfter: t.now.Add(-2 * time.Hour), Level: expiry.Expired}},
	}
}

// TestExpiryBadges: the clusters list and a cluster's page badge a
// credential inside the warning window ("expires in 2d") and an expired one
// ("expired", in its own style), not one outside it, and show why a token's
// expiry could not be read; the trust page badges our CA's chain and a
// peer's expired bundle.
func TestExpiryBadges(t *testing.T) {
	now := time.Now()
	m := expiringModels{now: now}
	h := New(Config{Membership: m, Registrar: m, Serving: m, Trust: expiringTrust{now}, Auth: &fakeAuth{}})

	list := signedInGet(t, h, "/clusters")
	for _, want := range []string{
		`<span class="pill expiry expiry-expiring" title="` + now.Add(3*24*time.Hour-time.Hour).UTC().Format("2006-01-02 15:04:05Z") + `">token expires in 2d</span>`,
		`<span class="pill expiry expiry-expired"`, `>client certificate expired</span>`,
		"the bearer token is a JWT whose payload is not a JSON object",
	} {
		if !strings.Contains(list, want) {
			t.Errorf("/clusters lacks %q:\n%s", want, list)
		}
	}
	if row := list[strings.Index(list, `data-cluster="later"`):]; strings.Contains(row[:strings.Index(row, "</tr>")], "expiry") {
		t.Errorf("a credential outside the window is badged: %s", row[:strings.Index(row, "</tr>")])
	}

	page := signedInGet(t, h, "/clusters/soon")
	if !strings.Contains(page, `token: expires at `+now.Add(3*24*time.Hour-time.Hour).UTC().Format("2006-01-02 15:04:05Z")) || !strings.Contains(page, "token expires in 2d") {
		t.Errorf("/clusters/soon:\n%s", page)
	}
	if page := signedInGet(t, h, "/clusters/gone"); !strings.Contains(page, "client certificate: expired at") || !strings.Contains(page, "client certificate expired</span>") {
		t.Errorf("/clusters/gone:\n%s", page)
	}
	if page := signedInGet(t, h, "/clusters/later"); strings.Contains(page, "expiry-") || !strings.Contains(page, "token: expires at") {
		t.Errorf("/clusters/later:\n%s", page)
	}

	tr := signedInGet(t, h, "/trust")
	for _, want := range []string{
		`CN=hub intermediate: expires at`, `>expires in 3d</span>`, `<code>hub-system/cacerts</code>`,
		`CN=peer root: expired at`, `<span class="pill expiry expiry-expired"`,
	} {
		if !strings.Contains(tr, want) {
			t.Errorf("/trust lacks %q:\n%s", want, tr)
		}
	}
	if strings.Count(tr, "expiry-expiring") != 2 || strings.Count(tr, "expiry-expired") != 2 { // each in the heading and the facts
		t.Errorf("/trust badges: %d expiring, %d expired; want 2 and 2", strings.Count(tr, "expiry-expiring"), strings.Count(tr, "expiry-expired"))
	}
}
