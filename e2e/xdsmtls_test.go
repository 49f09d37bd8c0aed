package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/internal/localcluster"
)

// TestGRPCXDSOverMTLS: a grpc-go xds:/// client reaches the hub's mTLS port
// through its bootstrap's "tls" channel credentials (gRFC A65) with a SPIFFE
// client certificate, verifying the hub's SVID against a SPIFFE trust
// bundle map (gRFC A87), and calls a backend through what the hub serves.
// The hub sees the client's verified SPIFFE ID.
func TestGRPCXDSOverMTLS(t *testing.T) {
	e := localcluster.Require(t, env)
	home, west := e.Cluster("primary"), e.Cluster("west")
	ctx := testContext(t)
	ip := dataPlaneIP(t)
	app := "mtls-" + rand.String(5)
	if err := localcluster.EnsureNamespace(ctx, client(t, west), app); err != nil {
		t.Fatal(err)
	}
	b := startBackend(t, ip, "west-mtls")
	const port = 7070
	if err := localcluster.ApplyService(ctx, client(t, west), app, "echo", "grpc", port,
		[]localcluster.Backend{{IP: b.addr.IP.String(), Port: int32(b.addr.Port)}}); err != nil {
		t.Fatal(err)
	}
	ns := hubNamespace(t, home)
	if _, err := client(t, home).CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "members", map[string][]byte{
		"west": west.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("mtls.test")
	h := startHub(t, home, "--namespace", ns, "--trust-domain", td.Name(), "--xds-tls-addr", "127.0.0.1:0")

	// The client's files: its SVID and key, and the trust bundle map that
	// holds our trust domain's bundle as the hub serves it.
	dir := t.TempDir()
	id := spiffeid.RequireFromPath(td, "/ns/"+app+"/sa/client")
	svid, err := hubCA(t, home, ns, td).IssueWorkloadSVID(id, "west", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := svid.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	_, bundleJSON := h.do(t, "GET", "/api/v1/trustdomains/"+td.Name()+"/bundle", "")
	files := map[string][]byte{
		"cert.pem": certPEM, "key.pem": keyPEM,
		"bundles.json": []byte(fmt.Sprintf(`{"trust_domains":{%q:%s}}`, td.Name(), bundleJSON)),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	creds := fmt.Sprintf(`[{"type":"tls","config":{"certificate_file":%q,"private_key_file":%q,"spiffe_trust_bundle_map_file":%q}}]`,
		filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), filepath.Join(dir, "bundles.json"))
	target := fmt.Sprintf("xds:///echo.%s.svc.cluster.local:%d", app, port)
	xc := startXDSClientWith(t, h.addrs["xds-tls"], creds, []string{"GRPC_EXPERIMENTAL_XDS_MTLS_SPIFFE=true"}, target, "west", app)
	xc.waitFor(t, 60*time.Second, "an answer from west-mtls over the mTLS xDS port", func(l clientLine) bool { return l.text == "ok west-mtls" })

	eventually(t, 10*time.Second, func() error {
		var proxies api.List[api.Proxy]
		h.getJSON(t, "/api/v1/proxies", &proxies)
		for _, p := range proxies.Items {
			if strings.Contains(p.ID, "client."+app) {
				if p.Identity != id.String() || p.Cluster != "west" {
					return fmt.Errorf("proxy %s: identity %q cluster %q; want %s in west", p.ID, p.Identity, p.Cluster, id)
				}
				return nil
			}
		}
		return fmt.Errorf("the client's stream is not listed: %+v", proxies.Items)
	})
}
