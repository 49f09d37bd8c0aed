package api

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hubmesh/hub/hub/ca"
)

type fakeCA struct{ st ca.CertificateStats }

func (f fakeCA) Certificates() (ca.CertificateStats, bool) { return f.st, true }

// staticAuth is the static tokens of newTestHandler.
func staticAuth(t *testing.T) Authenticator {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("reader-token,rita,read\nwriter-token,walt,write\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auth, err := LoadStaticTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	return auth
}

func TestCertificates(t *testing.T) {
	h, _ := newTestHandler(t, &fakeMembership{})
	problem(t, do(t, h, "GET", "/api/v1/certificates", "reader-token", ""), 404, "CA is not served")

	expiry := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	fake := fakeCA{ca.CertificateStats{DefaultTTL: 24 * time.Hour, MaxTTL: 7 * 24 * time.Hour,
		Groups:   []ca.CertificateGroup{{Member: "west", Namespace: "a", Issued: 3, Valid: 2, NextExpiry: expiry}, {Member: "east", Namespace: "b", Issued: 1}},
		Failures: []ca.Failure{{Reason: "invalid_csr", Total: 4, LastHour: 1, Last: expiry, LastMessage: "the CSR is not a PEM CERTIFICATE REQUEST"}, {Reason: "invalid_ttl"}},
	}}
	h = NewHandler(Config{Membership: &fakeMembership{}, Serving: fakeServing{}, CA: fake, Auth: staticAuth(t), Metrics: prometheus.NewRegistry()})
	problem(t, do(t, h, "GET", "/api/v1/certificates", "", ""), 401, "bearer token")
	rec := do(t, h, "GET", "/api/v1/certificates", "reader-token", "")
	var got Certificates
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || rec.Code != 200 {
		t.Fatalf("%d %s: %v", rec.Code, rec.Body, err)
	}
	if got.DefaultTTLSeconds != 86400 || got.MaxTTLSeconds != 7*86400 || len(got.Issued) != 2 || len(got.Failures) != 2 {
		t.Fatalf("got %+v", got)
	}
	if w := got.Issued[0]; w.Member != "west" || w.Issued != 3 || w.Valid != 2 || w.NextExpiry == nil || !w.NextExpiry.Equal(expiry) {
		t.Errorf("west group %+v", w)
	}
	if got.Issued[1].NextExpiry != nil || got.Failures[1].Last != nil {
		t.Errorf("zero times are not null: %s", rec.Body)
	}
	if f := got.Failures[0]; f.Reason != "invalid_csr" || f.Total != 4 || f.LastHour != 1 || f.LastMessage == "" {
		t.Errorf("failure %+v", f)
	}
}
