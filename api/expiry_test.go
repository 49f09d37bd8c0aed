package api

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/internal/expiry"
	"github.com/hubmesh/hub/trust"
)

// TestExpiryJSON: a member's credentials and a trust domain's CA and
// bundle expiry in the API's JSON, with their state and badge; a token
// whose expiry could not be read has its error and no time.
func TestExpiryJSON(t *testing.T) {
	soon := time.Now().Add(3*24*time.Hour + time.Minute).UTC().Truncate(time.Second)
	c := ToCluster(clusters.Status{ID: "m", Credentials: []clusters.CredentialExpiry{
		{Credential: clusters.CredentialToken, NotAfter: soon, Level: expiry.Expiring},
		{Credential: clusters.CredentialClientCertificate, Error: "unreadable"},
	}})
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	want := `"credentials":[{"credential":"token","notAfter":"` + soon.Format(time.RFC3339) + `","state":"expiring","badge":"expires in 3d"},{"credential":"client_certificate","error":"unreadable"}]`
	if !strings.Contains(string(data), want) {
		t.Errorf("cluster JSON %s; want it to contain %s", data, want)
	}
	if data, _ := json.Marshal(ToCluster(clusters.Status{ID: "home"})); strings.Contains(string(data), "credentials") {
		t.Errorf("a member without credentials: %s", data)
	}

	past := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	local := ToTrustDomain(trust.Status{Local: true, CA: &trust.CAExpiry{
		Root: trust.CertExpiry{Subject: "CN=root", NotAfter: soon, Level: expiry.Expiring}, Chain: trust.CertExpiry{Subject: "CN=int", NotAfter: past, Level: expiry.Expired}, Secret: "ns/cacerts"}})
	data, _ = json.Marshal(local)
	for _, want := range []string{
		`"ca":{"root":{"subject":"CN=root","notAfter":"` + soon.Format(time.RFC3339) + `","state":"expiring","badge":"expires in 3d"}`,
		`"chain":{"subject":"CN=int","notAfter":"` + past.Format(time.RFC3339) + `","state":"expired","badge":"expired"},"secret":"ns/cacerts"}`,
	} {
		if !strings.Contains(string(data), want) {
			t.Errorf("trust domain JSON %s; want it to contain %s", data, want)
		}
	}
	if strings.Contains(string(data), "bundleExpiry") {
		t.Errorf("our trust domain has a bundle expiry: %s", data)
	}
	peer, _ := json.Marshal(ToTrustDomain(trust.Status{BundleExpiry: trust.CertExpiry{Subject: "CN=p", NotAfter: past, Level: expiry.Expired}}))
	if !strings.Contains(string(peer), `"bundleExpiry":{"subject":"CN=p","notAfter":"`+past.Format(time.RFC3339)+`","state":"expired","badge":"expired"}`) {
		t.Errorf("peer JSON %s", peer)
	}
}
