package e2e

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	krand "k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/trust"
)

// adscBin is Istio's adsc driven by e2e/interop/cmd/adscclient, a module of
// its own (Istio's dependency set is not the hub's). `make test` builds it
// into bin/ and exports HUB_ADSC_BIN.
func adscBin(t *testing.T) string {
	t.Helper()
	const how = "build it with `cd e2e/interop && go build -o ../../bin/adscclient ./cmd/adscclient` " +
		"(~6 min cold) and export HUB_ADSC_BIN=$PWD/bin/adscclient, or run `make test`"
	return binaryFromEnv(t, "HUB_ADSC_BIN", how)
}

// adscLine is one JSON line of adscclient's stdout.
type adscLine struct {
	Type       string              `json:"type"`
	Event      string              `json:"event"`
	Clusters   []string            `json:"clusters"`
	Cluster    string              `json:"cluster"`
	Endpoints  []string            `json:"endpoints"`
	ByMember   map[string][]string `json:"byMember"`
	Weights    map[string]uint32   `json:"weights"`    // EDS: endpoint → load balancing weight
	Priorities map[string]uint32   `json:"priorities"` // EDS: endpoint → its locality's priority
	MTLS       []string            `json:"mtls"`       // EDS: endpoints with tlsMode istio
	Name       string              `json:"name"`
	Kind       string              `json:"kind"`
	CertChain  string              `json:"certChain"`
	PrivateKey bool                `json:"privateKey"`
	TrustedCA  string              `json:"trustedCA"`
	CACerts    []string            `json:"caCerts"`
	Complete   bool                `json:"complete"`
	Received   []string            `json:"received"`
	Missing    []string            `json:"missing"`
	Error      string              `json:"error"`
}

// adscRun is a running adscclient.
type adscRun struct {
	name   string
	cmd    *exec.Cmd
	stderr bytes.Buffer
	mu     sync.Mutex
	lines  []adscLine
	raw    []string
	more   chan struct{} // closed and replaced on every new line
	done   chan struct{}
	code   int
}

// startAdsc runs adscclient with args; it is killed at the end of the test.
func startAdsc(t *testing.T, name string, args ...string) *adscRun {
	t.Helper()
	r := &adscRun{name: name, cmd: exec.Command(adscBin(t), args...), more: make(chan struct{}), done: make(chan struct{})}
	r.cmd.Stderr = &r.stderr
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("starting adscclient: %v", err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var l adscLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				l = adscLine{Type: "unparsed", Error: sc.Text()}
			}
			r.mu.Lock()
			r.lines, r.raw = append(r.lines, l), append(r.raw, sc.Text())
			close(r.more)
			r.more = make(chan struct{})
			r.mu.Unlock()
		}
		err := r.cmd.Wait()
		r.code = r.cmd.ProcessState.ExitCode()
		if err != nil && r.code < 0 {
			r.code = -1
		}
		close(r.done)
	}()
	t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		<-r.done
		if t.Failed() {
			t.Logf("adscclient %s stdout:\n%s\nstderr:\n%s", r.name, strings.Join(r.raw, "\n"), tail(r.stderr.String(), 40))
		} else if testing.Verbose() {
			t.Logf("adscclient %s stdout:\n%s", r.name, strings.Join(r.raw, "\n"))
		}
	})
	return r
}

// wait waits for the client to exit and returns its exit code and lines.
func (r *adscRun) wait(t *testing.T, timeout time.Duration) (int, []adscLine) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(timeout):
		t.Fatalf("adscclient %s did not exit within %s", r.name, timeout)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.code, slices.Clone(r.lines)
}

// waitLine waits until a line satisfies match, without polling.
func (r *adscRun) waitLine(t *testing.T, timeout time.Duration, what string, match func(adscLine) bool) adscLine {
	t.Helper()
	return r.waitLineAfter(t, 0, timeout, what, match)
}

// adscResult is what one adscclient run received.
type adscResult struct {
	clusters  map[string]bool
	endpoints map[string][]string // member → endpoints of the watched EDS cluster
	secrets   map[string]adscLine
	summary   adscLine
}

func collect(lines []adscLine, edsCluster string) adscResult {
	res := adscResult{clusters: map[string]bool{}, endpoints: map[string][]string{}, secrets: map[string]adscLine{}}
	for _, l := range lines {
		switch l.Type {
		case "cds":
			for _, c := range l.Clusters {
				res.clusters[c] = l.Event != "delete"
			}
		case "eds":
			if l.Cluster == edsCluster && l.Event != "delete" {
				res.endpoints = l.ByMember
			}
		case "sds":
			if l.Name != "" && l.Event != "delete" {
				res.secrets[l.Name] = l
			}
		case "summary":
			res.summary = l
		}
	}
	return res
}

// TestAdscIstioClient drives Istio's own ADS client (pkg/adsc, SotW and
// Delta) against the hub's mTLS xDS port with SPIFFE client certificates:
// CDS and EDS federated from two members, SDS of the proxy's own member and
// namespace, ROOTCA, and no secret for a workload of another namespace.
func TestAdscIstioClient(t *testing.T) {
	adscBin(t) // skip (or fail in CI) before setting anything up
	e := localcluster.Require(t, env)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	ctx := testContext(t)
	ns := hubNamespace(t, home)
	app := "app-" + krand.String(5) // a fresh namespace per test; the SVIDs name it
	svc := "gw-" + krand.String(4)
	edsCluster := "outbound|80||" + svc + "." + app + ".svc.cluster.local"

	certSum := map[string]string{} // member → sha256 of its gw-cert tls.crt
	for c, ip := range map[*localcluster.Cluster]string{west: "198.18.10.1", east: "198.18.20.1"} {
		cs := client(t, c)
		if err := localcluster.EnsureNamespace(ctx, cs, app); err != nil {
			t.Fatal(err)
		}
		if err := localcluster.ApplyService(ctx, cs, app, svc, "http", 80, []localcluster.Backend{{IP: ip, Port: 8080}}); err != nil {
			t.Fatal(err)
		}
		certPEM, keyPEM := selfSigned(t, "gw."+c.Name+".example")
		sum := sha256.Sum256(certPEM)
		certSum[c.Name] = "sha256:" + hex.EncodeToString(sum[:])
		if _, err := cs.CoreV1().Secrets(app).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "gw-cert"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client(t, home).CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "members", map[string][]byte{
		"west": west.Kubeconfig(), "east": east.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("adsc.test")
	h := startHub(t, home, "--namespace", ns, "--trust-domain", td.Name(), "--xds-tls-addr", "127.0.0.1:0")
	tlsAddr := h.addrs["xds-tls"]
	if tlsAddr == "" {
		t.Fatalf("the hub logged no xds-tls listener: %v", h.addrs)
	}
	// Both members' endpoints are in the hub's index before a client asks,
	// so that the first EDS answer already holds both.
	eventually(t, 30*time.Second, func() error {
		var list api.List[api.Service]
		h.getJSON(t, "/api/v1/services", &list)
		for _, s := range list.Items {
			if s.Namespace == app && s.Name == svc && s.Endpoints["west"] == 1 && s.Endpoints["east"] == 1 {
				return nil
			}
		}
		return fmt.Errorf("service %s/%s not federated from west and east yet", app, svc)
	})

	// Files as a workload would have them: its SVID chain and key, and the
	// hub's trust bundle as served by the hub itself.
	dir := t.TempDir()
	ca := hubCA(t, home, ns, td)
	bundle := h.bundle(t, td)
	var rootsPEM []byte
	var roots []string // sha256 of each root's DER
	for _, c := range bundle.X509Authorities() {
		rootsPEM = append(rootsPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
		roots = append(roots, trust.CertSHA256(c))
	}
	caFile := filepath.Join(dir, "root-cert.pem")
	writeFile(t, caFile, rootsPEM)
	// Each workload's SVID is bound to the member it runs in.
	svidFiles := func(ns, member string) []string {
		certFile, keyFile := writeSVID(t, ca, spiffeid.RequireFromPath(td, "/ns/"+ns+"/sa/gateway"), member, filepath.Join(dir, ns+"-"+member))
		return []string{"--cert", certFile, "--key", keyFile}
	}
	appCreds := map[string][]string{"west": svidFiles(app, "west"), "east": svidFiles(app, "east")}
	otherCreds := svidFiles("other", "west")

	// adsc's SotW client ACKs SDS without resource names (adsc.ack names
	// only EDS and RDS), which unsubscribes it from every secret after the
	// first answer: both members' gw-cert must be in the hub before it asks.
	// (The Secret informers sync shortly after the members are Ready.)
	probeCreds := func(member string) credentials.TransportCredentials {
		probe, err := ca.IssueWorkloadSVID(spiffeid.RequireFromPath(td, "/ns/"+app+"/sa/probe"), member, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return credentials.NewTLS(tlsconfig.MTLSClientConfig(probe, bundle, tlsconfig.AuthorizeID(spiffeid.RequireFromPath(td, "/hub"))))
	}
	eventually(t, 30*time.Second, func() error {
		for _, member := range []string{"west", "east"} {
			if got := sdsFetch(t, tlsAddr, probeCreds(member), member, "kubernetes://gw-cert"); got["kubernetes://gw-cert"] == nil {
				return fmt.Errorf("the hub has no gw-cert of %s yet", member)
			}
		}
		return nil
	})
	common := []string{"--addr", tlsAddr, "--ca", caFile, "--server-spiffe-id", "spiffe://" + td.Name() + "/hub", "--log-level", "warn"}
	watch := "cds,eds:" + edsCluster + ",sds:kubernetes://gw-cert,sds:ROOTCA"
	cross := "kubernetes://" + app + "/gw-cert"

	for _, mode := range []string{"sotw", "delta"} {
		t.Run(mode, func(t *testing.T) {
			args := func(member, ns string, creds []string, watch string) []string {
				a := append(slices.Clone(common), creds...)
				a = append(a, "--cluster-id", member, "--watch", watch, "--timeout", "30s",
					"--node-id", fmt.Sprintf("router~198.18.0.9~gateway-%s.%s~%s.svc.cluster.local", mode, ns, ns))
				if mode == "delta" {
					a = append(a, "--delta")
				}
				return a
			}
			// The client checks the server's SPIFFE ID, not only its chain.
			wrongID := append(args("west", app, appCreds["west"], watch), "--server-spiffe-id", "spiffe://"+td.Name()+"/not-hub")
			if code, lines := startAdsc(t, mode+"/wrong-server-id", wrongID...).wait(t, 30*time.Second); code != 1 ||
				!slices.ContainsFunc(lines, func(l adscLine) bool { return l.Type == "error" && strings.Contains(l.Error, "server SPIFFE ID") }) || len(collect(lines, edsCluster).secrets) != 0 {
				t.Errorf("a client expecting spiffe://%s/not-hub: exit %d, lines %+v; want exit 1 with an error and nothing received", td.Name(), code, lines)
			}

			// One client per member, and one of another namespace that
			// also asks for app's gw-cert by namespace, at once.
			westRun := startAdsc(t, mode+"/west", args("west", app, appCreds["west"], watch)...)
			eastRun := startAdsc(t, mode+"/east", args("east", app, appCreds["east"], watch)...)
			otherRun := startAdsc(t, mode+"/other", args("west", "other", otherCreds, watch+",sds:"+cross)...)

			for _, c := range []struct {
				run    *adscRun
				member string
			}{{westRun, "west"}, {eastRun, "east"}} {
				code, lines := c.run.wait(t, 40*time.Second)
				res := collect(lines, edsCluster)
				if code != 0 || !res.summary.Complete {
					t.Fatalf("%s: exit %d, summary %+v", c.run.name, code, res.summary)
				}
				if !res.clusters[edsCluster] {
					t.Errorf("%s: CDS lacks %s: %v", c.run.name, edsCluster, res.clusters)
				}
				if !slices.Equal(res.endpoints["west"], []string{"198.18.10.1:8080"}) || !slices.Equal(res.endpoints["east"], []string{"198.18.20.1:8080"}) {
					t.Errorf("%s: EDS %s by member = %v, want west's and east's endpoint", c.run.name, edsCluster, res.endpoints)
				}
				gw := res.secrets["kubernetes://gw-cert"]
				if gw.Kind != "tlsCertificate" || gw.CertChain != certSum[c.member] || !gw.PrivateKey {
					t.Errorf("%s: kubernetes://gw-cert = %+v, want %s's certificate %s with its key", c.run.name, gw, c.member, certSum[c.member])
				}
				if root := res.secrets["ROOTCA"]; root.Kind != "validationContext" || !slices.Equal(root.CACerts, roots) {
					t.Errorf("%s: ROOTCA = %+v, want the hub's roots %v", c.run.name, root, roots)
				}
			}

			// The workload of namespace "other" gets CDS, EDS and ROOTCA but
			// no gw-cert: its own namespace has none, and app's is not its
			// to read. Once ROOTCA is there and the hub has logged that it
			// withheld both from this proxy, stop it and read what it got.
			otherRun.waitLine(t, 30*time.Second, "ROOTCA", func(l adscLine) bool { return l.Type == "sds" && l.Name == "ROOTCA" })
			nodeID := fmt.Sprintf("router~198.18.0.9~gateway-%s.other~other.svc.cluster.local", mode)
			eventually(t, 20*time.Second, func() error {
				if err := withheld(h.logPath, nodeID, "kubernetes://gw-cert"); err != nil {
					return err
				}
				return withheld(h.logPath, nodeID, cross)
			})
			_ = otherRun.cmd.Process.Signal(syscall.SIGTERM)
			code, lines := otherRun.wait(t, 20*time.Second)
			res := collect(lines, edsCluster)
			if want := []string{"sds:" + cross, "sds:kubernetes://gw-cert"}; code != 2 || res.summary.Complete || !slices.Equal(slices.Sorted(slices.Values(res.summary.Missing)), want) {
				t.Errorf("%s: exit %d, summary %+v; want exit 2 missing only %v", otherRun.name, code, res.summary, want)
			}
			if len(res.secrets) != 1 {
				t.Errorf("%s: a workload of namespace other received secrets %v; want only ROOTCA", otherRun.name, res.secrets)
			}
			if !slices.Equal(res.secrets["ROOTCA"].CACerts, roots) || !res.clusters[edsCluster] {
				t.Errorf("%s: want CDS and ROOTCA, got clusters %v secrets %v", otherRun.name, res.clusters, res.secrets)
			}
		})
	}

	// Pushes reach adsc too: a Delta --follow client sees west's gw-cert
	// rotate. (Not SotW: its nameless SDS ACK unsubscribed it, see above.)
	a := append(slices.Clone(common), appCreds["west"]...)
	a = append(a, "--cluster-id", "west", "--watch", "sds:kubernetes://gw-cert", "--follow", "--delta",
		"--node-id", fmt.Sprintf("router~198.18.0.9~follow.%s~%s.svc.cluster.local", app, app))
	follow := startAdsc(t, "delta/follow", a...)
	follow.waitLine(t, 30*time.Second, "west's gw-cert", func(l adscLine) bool { return l.Name == "kubernetes://gw-cert" && l.CertChain == certSum["west"] })
	certPEM, keyPEM := selfSigned(t, "gw.west.rotated.example")
	sum := sha256.Sum256(certPEM)
	rotated := "sha256:" + hex.EncodeToString(sum[:])
	westSecrets := client(t, west).CoreV1().Secrets(app)
	s, err := westSecrets.Get(ctx, "gw-cert", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Data = map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM}
	if _, err := westSecrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	follow.waitLine(t, 20*time.Second, "the rotated gw-cert", func(l adscLine) bool { return l.Name == "kubernetes://gw-cert" && l.CertChain == rotated })
}

// withheld reports whether the hub logged that it withheld resource from proxy.
func withheld(logPath, proxy, resource string) error {
	data, err := os.ReadFile(logPath)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(data), "\n") {
		var entry map[string]any
		if json.Unmarshal([]byte(line), &entry) == nil && entry["msg"] == "SDS resource withheld" && entry["proxy"] == proxy && entry["resource"] == resource {
			return nil
		}
	}
	return errors.New("the hub has not logged withholding " + resource + " from " + proxy)
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// writeSVID issues an SVID for id bound to member from the hub's CA and
// writes its chain and key as PEM files in dir.
func writeSVID(t *testing.T, ca *trust.CA, id spiffeid.ID, member, dir string) (certFile, keyFile string) {
	t.Helper()
	svid, err := ca.IssueWorkloadSVID(id, member, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := svid.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert-chain.pem"), filepath.Join(dir, "key.pem")
	writeFile(t, certFile, certPEM)
	writeFile(t, keyFile, keyPEM)
	return certFile, keyFile
}

// selfSigned returns a throwaway certificate and key for a gateway Secret.
func selfSigned(t *testing.T, host string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}
