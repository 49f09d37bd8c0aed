package web

import (
	"strings"
	"testing"
	"time"

	"github.com/hubmesh/hub/hub/ca"
)

func (fakeModels) Certificates() (ca.CertificateStats, bool) {
	return ca.CertificateStats{DefaultTTL: 24 * time.Hour, MaxTTL: 168 * time.Hour,
		Groups: []ca.CertificateGroup{{Member: "west", Namespace: "shop", Issued: 42, Valid: 7, NextExpiry: time.Now().Add(5 * time.Hour)}},
		Failures: []ca.Failure{{Reason: "invalid_csr", Total: 3, LastHour: 2, Last: time.Now(),
			LastMessage: `the CSR cannot be parsed: <script>alert(1)</script>`}, {Reason: "invalid_ttl"}},
	}, true
}

// TestTrustPageShowsWorkloadCertificates: the trust page lists what the CA
// issued per member and namespace and what it refused, escaped.
func TestTrustPageShowsWorkloadCertificates(t *testing.T) {
	m := fakeModels{}
	h := New(Config{Membership: m, Registrar: m, Serving: m, CA: m, Auth: &fakeAuth{}})
	body := signedInGet(t, h, "/trust")
	for _, want := range []string{"Workload certificates", "<td>west</td><td>shop</td><td>42</td><td>7</td>", "(in 5h0m0s)",
		"at most 168h0m0s", "<code>invalid_csr</code></td><td>2</td><td>3</td>", "&lt;script&gt;"} {
		if !strings.Contains(body, want) {
			t.Errorf("trust page lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "<script>alert") {
		t.Error("a refusal message is rendered unescaped")
	}
}
