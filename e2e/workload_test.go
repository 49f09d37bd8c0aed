package e2e

import (
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"google.golang.org/grpc/credentials"

	"github.com/hubmesh/hub/trust"
)

// bundle returns trust domain td's bundle as the hub's API serves it.
func (h *hubProcess) bundle(t *testing.T, td spiffeid.TrustDomain) *spiffebundle.Bundle {
	t.Helper()
	_, body := h.do(t, "GET", "/api/v1/trustdomains/"+td.Name()+"/bundle", "")
	b, err := spiffebundle.Parse(td, []byte(body))
	if err != nil {
		t.Fatalf("the hub's bundle of %s: %v", td.Name(), err)
	}
	return b
}

// workloadCreds returns mTLS credentials of workloads as the hub's CA
// issues them: spiffe://<td>/ns/<ns>/sa/<sa>, bound to the member the
// workload runs in (the member whose Secrets it may read), verifying the
// hub's own SVID against bundle.
func workloadCreds(t *testing.T, ca *trust.CA, bundle *spiffebundle.Bundle) func(ns, sa, member string) credentials.TransportCredentials {
	td := bundle.TrustDomain()
	return func(ns, sa, member string) credentials.TransportCredentials {
		t.Helper()
		svid, err := ca.IssueWorkloadSVID(spiffeid.RequireFromPath(td, "/ns/"+ns+"/sa/"+sa), member, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return credentials.NewTLS(tlsconfig.MTLSClientConfig(svid, bundle, tlsconfig.AuthorizeID(spiffeid.RequireFromPath(td, "/hub"))))
	}
}
