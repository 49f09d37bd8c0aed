package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/internal/listening"
	"github.com/hubmesh/hub/internal/localcluster"
)

// The ca shape measures the hub's CA (Istio's CA API on the mTLS xDS
// port): --streams callers, each with its own gRPC connection, its own
// real ServiceAccount token (audience istio-ca) of one member and one
// pre-generated RSA-2048 CSR, call CreateCertificate back to back for
// --ca-duration (calls in flight then finish and count), as istio-agents
// renewing at once would. Each caller's first call (its token review) is
// made before the measurement starts, so reviews are answered from the
// hub's cache, as for a fleet that renews.
// It reports certificates per second, latency and the hub's CPU per
// certificate (procStats). The callers run on the same
// machine and take CPU from the hub: the figures are a lower bound.
const shapeCA = "ca"

// caCallTimeout bounds one CreateCertificate call: a certificate not
// issued within it counts as failed (DeadlineExceeded).
const caCallTimeout = 30 * time.Second

// caTrustDomain is the hub's trust domain in the ca shape.
const caTrustDomain = "bench.local"

// CASummary is the result of the ca shape.
type CASummary struct {
	Machine         Machine        `json:"machine"`
	HubBuild        string         `json:"hubBuild"`
	Callers         int            `json:"callers"`
	Seconds         float64        `json:"seconds"`
	Issued          int            `json:"issued"`
	Failed          int            `json:"failed"`
	FailedByCode    map[string]int `json:"failedByCode,omitempty"` // gRPC code → calls
	PerSecond       float64        `json:"certificatesPerSecond"`
	P50Ms           float64        `json:"p50Ms"`
	P99Ms           float64        `json:"p99Ms"`
	HubCPUSeconds   float64        `json:"hubCpuSeconds"`
	HubCPUMsPerCert float64        `json:"hubCpuMsPerCertificate"`
	HubCores        float64        `json:"hubCores"` // hub CPU seconds per wall second
	HubRSSMiB       float64        `json:"hubRssMiB"`
	FirstError      string         `json:"firstError,omitempty"`
}

// WriteText prints the summary for people.
func (s *CASummary) WriteText(w io.Writer) {
	fmt.Fprintf(w, "hub CA (Istio CreateCertificate, RSA-2048 CSRs, token reviews cached) on %d CPUs (%s), hub %s\n", s.Machine.CPUs, s.Machine.CPUModel, s.HubBuild)
	fmt.Fprintf(w, "  callers %d, %.1f s: %d certificates issued, %d failed\n", s.Callers, s.Seconds, s.Issued, s.Failed)
	for _, code := range slices.Sorted(maps.Keys(s.FailedByCode)) {
		fmt.Fprintf(w, "    %s: %d\n", code, s.FailedByCode[code])
	}
	fmt.Fprintf(w, "  %.0f certificates/s; latency p50 %.2f ms, p99 %.2f ms\n", s.PerSecond, s.P50Ms, s.P99Ms)
	fmt.Fprintf(w, "  hub CPU %.2f s = %.3f ms per certificate (%.2f cores busy); hub RSS %.0f MiB\n", s.HubCPUSeconds, s.HubCPUMsPerCert, s.HubCores, s.HubRSSMiB)
	if s.FirstError != "" {
		fmt.Fprintf(w, "  first error: %s\n", s.FirstError)
	}
}

// runCA runs the ca shape: the home cluster and one member, the hub with
// its mTLS port, the callers.
func runCA(ctx context.Context, cfg Config) (_ *CASummary, err error) {
	sum := &CASummary{Machine: machine(), Callers: cfg.Streams}
	work, err := os.MkdirTemp("", "hubbench-ca-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	hubBin, err := caHubBin(ctx, cfg, work, sum)
	if err != nil {
		return nil, err
	}
	const member = "m01"
	env, err := startCAClusters(ctx, cfg, work, member)
	if err != nil {
		return nil, err
	}
	defer env.Stop()
	memberClient, err := registerCAMember(ctx, env, member)
	if err != nil {
		return nil, err
	}
	tokens, csrs, err := caCredentials(ctx, cfg, memberClient)
	if err != nil {
		return nil, err
	}

	h, err := startCAHub(ctx, cfg, hubBin, work, env)
	if err != nil {
		return nil, err
	}
	defer h.stop()
	defer func() {
		if err != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w\nhub log (%s) tail:\n%s", err, h.logPath, h.tail(20))
		}
	}()
	tlsAddr, creds, err := hubCAEndpoint(ctx, cfg, h, member)
	if err != nil {
		return nil, err
	}

	// One connection per caller, like agents; each caller's first call
	// makes the member review its token (cached from then on).
	cfg.progress("connecting %d callers; each one's first certificate warms the token review cache", cfg.Streams)
	clients := make([]securityv1alpha1.IstioCertificateServiceClient, cfg.Streams)
	for i := range clients {
		conn, err := grpc.NewClient(tlsAddr, grpc.WithTransportCredentials(creds))
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		clients[i] = securityv1alpha1.NewIstioCertificateServiceClient(conn)
	}
	call := func(ctx context.Context, i int) error {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tokens[i], "ClusterID", member)
		resp, err := clients[i].CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: csrs[i]})
		if err == nil && len(resp.GetCertChain()) < 2 {
			err = fmt.Errorf("a chain of %d certificates", len(resp.GetCertChain()))
		}
		return err
	}
	for i := range clients {
		if err := call(ctx, i); err != nil {
			return nil, fmt.Errorf("caller %d's first certificate: %w", i, err)
		}
	}

	if err := measureIssuing(ctx, cfg, h, call, sum); err != nil {
		return nil, err
	}
	if sum.Issued == 0 {
		return sum, fmt.Errorf("no certificate issued: %s", sum.FirstError)
	}
	return sum, nil
}

// caHubBin returns the hub binary, --hub-bin or else the hub built in
// work, and records its build in sum.
func caHubBin(ctx context.Context, cfg Config, work string, sum *CASummary) (string, error) {
	if cfg.HubBin != "" {
		sum.HubBuild = hubBuild(cfg.HubBin)
		return cfg.HubBin, nil
	}
	cfg.progress("building the hub")
	hubBin, build, err := buildHub(ctx, work)
	if err != nil {
		return "", err
	}
	sum.HubBuild = build
	return hubBin, nil
}

// startCAClusters starts the ca shape's local API servers: the home
// cluster's and member's. The caller stops them.
func startCAClusters(ctx context.Context, cfg Config, work, member string) (*localcluster.Env, error) {
	binDir, err := localcluster.BinDir(ctx)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver and etcd binaries: %w", err)
	}
	cfg.progress("starting 2 local API servers (%s and %s)", homeID, member)
	clustersDir := filepath.Join(work, "clusters")
	if err := os.MkdirAll(clustersDir, 0o755); err != nil {
		return nil, err
	}
	env, err := localcluster.Start(ctx, localcluster.Options{Names: []string{homeID, member}, BinDir: binDir, Dir: clustersDir})
	if err != nil {
		return nil, fmt.Errorf("starting local clusters: %w", err)
	}
	return env, nil
}

// registerCAMember makes the hub's namespace in the home cluster and
// member's remote Secret there, and the bench namespace in member; it
// returns member's client.
func registerCAMember(ctx context.Context, env *localcluster.Env, member string) (kubernetes.Interface, error) {
	homeClient, err := kubernetes.NewForConfig(env.Cluster(homeID).RESTConfig())
	if err != nil {
		return nil, err
	}
	memberClient, err := kubernetes.NewForConfig(env.Cluster(member).RESTConfig())
	if err != nil {
		return nil, err
	}
	if err := localcluster.EnsureNamespace(ctx, homeClient, hubNamespace); err != nil {
		return nil, err
	}
	if _, err := homeClient.CoreV1().Secrets(hubNamespace).Create(ctx, localcluster.RemoteSecret(hubNamespace, "hubbench-members",
		map[string][]byte{member: env.Cluster(member).Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating the remote secret: %w", err)
	}
	if err := localcluster.EnsureNamespace(ctx, memberClient, benchNamespace); err != nil {
		return nil, err
	}
	return memberClient, nil
}

// caCredentials creates a ServiceAccount per caller in the member and
// returns each one's token (audience istio-ca) and a PEM RSA-2048 CSR.
func caCredentials(ctx context.Context, cfg Config, memberClient kubernetes.Interface) (tokens, csrs []string, err error) {
	cfg.progress("creating %d ServiceAccounts, their tokens and RSA-2048 CSRs", cfg.Streams)
	tokens, csrs = make([]string, cfg.Streams), make([]string, cfg.Streams)
	for i := range cfg.Streams {
		sa := fmt.Sprintf("workload-%04d", i)
		if _, err := memberClient.CoreV1().ServiceAccounts(benchNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			return nil, nil, fmt.Errorf("creating ServiceAccount %s: %w", sa, err)
		}
		tr, err := memberClient.CoreV1().ServiceAccounts(benchNamespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"istio-ca"}}}, metav1.CreateOptions{})
		if err != nil {
			return nil, nil, fmt.Errorf("requesting a token of %s: %w", sa, err)
		}
		tokens[i] = tr.Status.Token
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return nil, nil, err
		}
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
		if err != nil {
			return nil, nil, err
		}
		csrs[i] = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	}
	return tokens, csrs, nil
}

// startCAHub starts the hub hubBin on the home cluster, in its directory
// under work, with its mTLS xDS port and the ca shape's trust domain. The
// caller stops it.
func startCAHub(ctx context.Context, cfg Config, hubBin, work string, env *localcluster.Env) (*hubProcess, error) {
	hubDir := filepath.Join(work, "hub-run")
	if err := os.MkdirAll(hubDir, 0o755); err != nil {
		return nil, err
	}
	args := append([]string{"--xds-tls-addr", "127.0.0.1:0", "--trust-domain", caTrustDomain}, cfg.HubArgs...)
	return startHub(ctx, hubBin, hubDir, env.Cluster(homeID).Kubeconfig(), args, cfg.HubEnv)
}

// hubCAEndpoint waits until the hub reports member Ready and returns the
// hub's mTLS xDS address and the callers' credentials: the hub's trust
// bundle, and the hub's SPIFFE ID expected of the server.
func hubCAEndpoint(ctx context.Context, cfg Config, h *hubProcess, member string) (string, credentials.TransportCredentials, error) {
	tlsAddr := listening.InFile(h.logPath)["xds-tls"]
	if tlsAddr == "" {
		return "", nil, errors.New("the hub logged no xds-tls listener")
	}
	if err := waitMemberReady(ctx, h, member, cfg.SyncTimeout); err != nil {
		return "", nil, err
	}
	td := spiffeid.RequireTrustDomainFromString(caTrustDomain)
	body, err := h.get(ctx, "/api/v1/trustdomains/"+caTrustDomain+"/bundle")
	if err != nil {
		return "", nil, err
	}
	bundle, err := spiffebundle.Parse(td, body)
	if err != nil {
		return "", nil, fmt.Errorf("the hub's bundle: %w", err)
	}
	creds := credentials.NewTLS(tlsconfig.TLSClientConfig(bundle, tlsconfig.AuthorizeID(spiffeid.RequireFromPath(td, "/hub"))))
	return tlsAddr, creds, nil
}

// measureIssuing has the callers issue certificates for cfg.CADuration
// (issueCertificates) and records what that took and cost the hub.
func measureIssuing(ctx context.Context, cfg Config, h *hubProcess, call func(context.Context, int) error, sum *CASummary) error {
	cfg.progress("issuing for %s with %d concurrent callers", cfg.CADuration, cfg.Streams)
	before, err := procStats(h.pid())
	if err != nil {
		return err
	}
	latencies, elapsed := issueCertificates(ctx, cfg, call, sum)
	after, err := procStats(h.pid())
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	sum.setFigures(latencies, elapsed, before, after)
	return nil
}

// issueCertificates has cfg.Streams callers (call with their index) call
// back to back for cfg.CADuration and returns the latencies of the
// certificates issued and how long that took; it counts the failures in
// sum.
func issueCertificates(ctx context.Context, cfg Config, call func(context.Context, int) error, sum *CASummary) ([]time.Duration, time.Duration) {
	// The window only stops callers from starting calls: a call in flight
	// when it ends finishes under its own caCallTimeout. (Calls that shared
	// the window's deadline failed with DeadlineExceeded when it passed,
	// before the context said so, and counted as failures on a busy
	// machine.) So every failure counted is one the hub returned.
	var mu sync.Mutex
	var latencies []time.Duration
	var wg sync.WaitGroup
	sum.FailedByCode = map[string]int{} // empty: omitted from the JSON
	start := time.Now()
	end := start.Add(cfg.CADuration)
	for i := range cfg.Streams {
		wg.Go(func() {
			var mine []time.Duration
			failed := map[string]int{}
			var first error
			for ctx.Err() == nil && time.Now().Before(end) {
				callCtx, cancel := context.WithTimeout(ctx, caCallTimeout)
				t0 := time.Now()
				err := call(callCtx, i)
				cancel()
				switch {
				case err == nil:
					mine = append(mine, time.Since(t0))
				case ctx.Err() == nil:
					failed[status.Code(err).String()]++
					if first == nil {
						first = err
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			latencies = append(latencies, mine...)
			for code, n := range failed {
				sum.Failed += n
				sum.FailedByCode[code] += n
			}
			if first != nil && sum.FirstError == "" {
				sum.FirstError = first.Error()
			}
		})
	}
	wg.Wait()
	return latencies, time.Since(start)
}

// setFigures fills in what the issuing measured: the certificates issued
// (latencies, which it sorts) over elapsed, and the hub's CPU and memory
// from its process figures before and after.
func (s *CASummary) setFigures(latencies []time.Duration, elapsed time.Duration, before, after ProcStats) {
	slices.Sort(latencies)
	s.Seconds = elapsed.Seconds()
	s.Issued = len(latencies)
	s.PerSecond = float64(s.Issued) / elapsed.Seconds()
	s.HubCPUSeconds = after.CPUSeconds - before.CPUSeconds
	s.HubCores = s.HubCPUSeconds / elapsed.Seconds()
	s.HubRSSMiB = after.RSSMiB
	if s.Issued > 0 {
		s.HubCPUMsPerCert = s.HubCPUSeconds * 1000 / float64(s.Issued)
		s.P50Ms = float64(latencies[len(latencies)/2]) / float64(time.Millisecond)
		s.P99Ms = float64(latencies[len(latencies)*99/100]) / float64(time.Millisecond)
	}
}

// waitMemberReady waits until the hub reports member Ready.
func waitMemberReady(ctx context.Context, h *hubProcess, member string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		cl, err := h.clusters(ctx)
		if err == nil {
			for _, c := range cl {
				if c.ID == member && c.State == "Ready" {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			state, _ := json.Marshal(cl)
			return fmt.Errorf("member %s not Ready within %s: %s (%v)", member, timeout, state, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
