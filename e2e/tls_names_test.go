package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/hubmesh/hub/internal/localcluster"
)

// TestServingCertificateDNSNames: with --tls-dns-names the hub's serving
// certificate on the mTLS xDS port carries those names, so a client that
// verifies the server by name against our root, as istiod's SIMPLE TLS
// config source and istio-agent do, accepts it; another name is refused.
func TestServingCertificateDNSNames(t *testing.T) {
	t.Parallel()
	e := localcluster.Require(t, env)
	home := e.Cluster("primary")
	ns := hubNamespace(t, home)
	td := spiffeid.RequireTrustDomainFromString("names.test")
	h := startHub(t, home, "--namespace", ns, "--trust-domain", td.Name(), "--xds-tls-addr", "127.0.0.1:0",
		"--tls-dns-names", "hub.hub-system.svc,*.hub.names.test")
	bundle := h.bundle(t, td)
	roots := x509.NewCertPool()
	for _, c := range bundle.X509Authorities() {
		roots.AddCert(c)
	}
	dial := func(serverName string) error {
		d := &tls.Dialer{Config: &tls.Config{ServerName: serverName, RootCAs: roots, NextProtos: []string{"h2"}}}
		conn, err := d.Dial("tcp", h.addrs["xds-tls"])
		if err == nil {
			conn.Close()
		}
		return err
	}
	for _, name := range []string{"hub.hub-system.svc", "xds.hub.names.test"} {
		eventually(t, 30*time.Second, func() error { return dial(name) })
	}
	if err := dial("hub.other-namespace.svc"); err == nil {
		t.Error("a name not in --tls-dns-names was accepted")
	}
}
