// Package localcluster runs real Kubernetes API servers on loopback for tests
// and for the demo (cmd/hubdemo): one etcd and one kube-apiserver per cluster, each cluster
// under its own etcd prefix. Binaries are built from the Go module proxy by the
// k8sbin tool module and cached outside the repository.
package localcluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// BinDirEnv names the environment variable that points at a directory holding
// etcd, kube-apiserver and kubectl. When unset, BinDir builds them.
const BinDirEnv = "HUB_K8S_BIN_DIR"

// BinDir returns the directory with the etcd, kube-apiserver and kubectl
// binaries, building them with k8sbin/build.sh when the cache is cold.
func BinDir(ctx context.Context) (string, error) {
	if dir := os.Getenv(BinDirEnv); dir != "" {
		if err := checkBinaries(dir); err != nil {
			return "", fmt.Errorf("%s=%s: %w", BinDirEnv, dir, err)
		}
		return dir, nil
	}
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate the k8sbin tool module: set " + BinDirEnv)
	}
	script := filepath.Join(filepath.Dir(self), "k8sbin", "build.sh")
	if _, err := os.Stat(script); err != nil {
		return "", fmt.Errorf("k8sbin build script not found (set %s to prebuilt binaries): %w", BinDirEnv, err)
	}
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("building Kubernetes binaries with %s: %w", script, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	dir := lines[len(lines)-1]
	if err := checkBinaries(dir); err != nil {
		return "", err
	}
	return dir, nil
}

func checkBinaries(dir string) error {
	for _, name := range []string{"etcd", "kube-apiserver", "kubectl"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("missing %s binary: %w", name, err)
		}
	}
	return nil
}

// Options configures Start.
type Options struct {
	// Names of the clusters to start, e.g. "primary", "west", "east".
	Names []string
	// BinDir holds etcd and kube-apiserver; empty means BinDir(ctx).
	BinDir string
	// Dir is the working directory for data, certificates and logs; empty
	// means a new temporary directory that Stop removes.
	Dir string
}

// Env is one etcd and the API servers that share it.
type Env struct {
	mu       sync.Mutex // guards pki's serial
	dir      string
	ownsDir  bool
	binDir   string
	pki      *pki
	etcd     *process
	etcdURL  string
	clusters []*Cluster
}

// Start starts etcd and one API server per name and waits until every API
// server is ready. On error everything already started is stopped.
func Start(ctx context.Context, opts Options) (_ *Env, err error) {
	if len(opts.Names) == 0 {
		return nil, errors.New("localcluster: no cluster names given")
	}
	e := &Env{dir: opts.Dir, binDir: opts.BinDir}
	if e.binDir == "" {
		if e.binDir, err = BinDir(ctx); err != nil {
			return nil, err
		}
	}
	if e.dir == "" {
		if e.dir, err = os.MkdirTemp("", "hub-localcluster-"); err != nil {
			return nil, fmt.Errorf("creating work dir: %w", err)
		}
		e.ownsDir = true
	}
	defer func() {
		if err != nil {
			e.Stop()
		}
	}()
	if e.pki, err = newPKI(e.dir); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		err := e.startEtcd(ctx)
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "address already in use") || attempt == 3 {
			return nil, err
		}
		if e.etcd != nil {
			e.etcd.stop()
		}
		_ = os.RemoveAll(filepath.Join(e.dir, "etcd-data"))
	}
	for _, name := range opts.Names {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		c := &Cluster{Name: name, env: e, port: port}
		e.clusters = append(e.clusters, c)
		if err := c.StartAPIServer(); err != nil {
			return nil, err
		}
	}
	for _, c := range e.clusters {
		for attempt := 1; ; attempt++ {
			err := c.WaitReady(ctx)
			if err == nil {
				break
			}
			// Another process may have taken the port between freePort and
			// the bind (test binaries run in parallel): pick another one.
			if !strings.Contains(err.Error(), "address already in use") || attempt == 3 {
				return nil, err
			}
			c.StopAPIServer()
			if c.port, err = freePort(); err != nil {
				return nil, err
			}
			c.mu.Lock()
			c.proc = nil
			c.mu.Unlock()
			if err := c.StartAPIServer(); err != nil {
				return nil, err
			}
		}
	}
	return e, nil
}

// Clusters returns the clusters in the order their names were given.
func (e *Env) Clusters() []*Cluster { return e.clusters }

// Cluster returns the cluster with that name, or nil.
func (e *Env) Cluster(name string) *Cluster {
	for _, c := range e.clusters {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Dir is the environment's working directory (logs are kept there).
func (e *Env) Dir() string { return e.dir }

// Stop stops every API server and etcd and removes the working directory if
// Start created it. It is safe to call more than once.
func (e *Env) Stop() {
	_ = e.ResumeEtcd() // a paused etcd cannot act on SIGTERM
	for _, c := range e.clusters {
		c.StopAPIServer()
	}
	if e.etcd != nil {
		if e.etcd != nil {
			e.etcd.stop()
		}
	}
	if e.ownsDir {
		_ = os.RemoveAll(e.dir)
	}
}

// PauseEtcd freezes the Env's etcd (SIGSTOP): its API servers stay up and
// serve watches from their caches, but everything that needs storage hangs,
// including their /readyz etcd check. ResumeEtcd undoes it.
func (e *Env) PauseEtcd() error {
	if err := e.etcd.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pausing etcd: %w", err)
	}
	return nil
}

// ResumeEtcd lets a paused etcd run again.
func (e *Env) ResumeEtcd() error {
	if e.etcd == nil || !e.etcd.alive() {
		return nil
	}
	if err := e.etcd.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("resuming etcd: %w", err)
	}
	return nil
}

func (e *Env) startEtcd(ctx context.Context) error {
	clientPort, err := freePort()
	if err != nil {
		return err
	}
	peerPort, err := freePort()
	if err != nil {
		return err
	}
	e.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	e.etcd, err = startProcess(filepath.Join(e.binDir, "etcd"), filepath.Join(e.dir, "etcd.log"),
		"--name=hub", "--data-dir="+filepath.Join(e.dir, "etcd-data"),
		"--listen-client-urls="+e.etcdURL, "--advertise-client-urls="+e.etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=hub="+peerURL, "--log-level=warn", "--unsafe-no-fsync")
	if err != nil {
		return err
	}
	return waitHTTP(ctx, http.DefaultClient, e.etcdURL+"/health", e.etcd, 60*time.Second)
}

// Cluster is one API server of an Env.
type Cluster struct {
	// Name is the cluster's name; its etcd prefix is /cluster-<Name>.
	Name string

	env  *Env
	port int

	mu   sync.Mutex
	proc *process
}

// Server is the API server's URL.
func (c *Cluster) Server() string { return fmt.Sprintf("https://127.0.0.1:%d", c.port) }

// RESTConfig returns an admin rest.Config for the cluster.
func (c *Cluster) RESTConfig() *rest.Config {
	return &rest.Config{
		Host: c.Server(),
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   c.env.pki.caPEM,
			CertData: c.env.pki.adminCertPEM,
			KeyData:  c.env.pki.adminKeyPEM,
		},
		QPS:   200,
		Burst: 400,
	}
}

// Kubeconfig returns a self-contained admin kubeconfig (certificates inline),
// as stored in a remote Secret.
func (c *Cluster) Kubeconfig() []byte {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[c.Name] = &clientcmdapi.Cluster{Server: c.Server(), CertificateAuthorityData: c.env.pki.caPEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: c.env.pki.adminCertPEM, ClientKeyData: c.env.pki.adminKeyPEM}
	cfg.Contexts[c.Name] = &clientcmdapi.Context{Cluster: c.Name, AuthInfo: "admin"}
	cfg.CurrentContext = c.Name
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		panic(fmt.Sprintf("serialising a kubeconfig built in memory: %v", err))
	}
	return out
}

// NewCertKubeconfig returns a kubeconfig with a freshly issued client
// certificate for a cluster admin: new credentials for rotation tests.
func (c *Cluster) NewCertKubeconfig() ([]byte, error) {
	c.env.mu.Lock()
	certPEM, keyPEM, err := c.env.pki.clientCert("hub-admin-rotated", "system:masters")
	c.env.mu.Unlock()
	if err != nil {
		return nil, err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[c.Name] = &clientcmdapi.Cluster{Server: c.Server(), CertificateAuthorityData: c.env.pki.caPEM}
	cfg.AuthInfos["rotated"] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts[c.Name] = &clientcmdapi.Context{Cluster: c.Name, AuthInfo: "rotated"}
	cfg.CurrentContext = c.Name
	return clientcmd.Write(*cfg)
}

// TokenKubeconfig returns a kubeconfig that authenticates with a bearer token
// instead of a client certificate.
func (c *Cluster) TokenKubeconfig(token string) []byte {
	return c.TokenKubeconfigAt(c.Server(), token)
}

// TokenKubeconfigAt is TokenKubeconfig for another API server of the
// cluster (a spare's address).
func (c *Cluster) TokenKubeconfigAt(server, token string) []byte {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[c.Name] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: c.env.pki.caPEM}
	cfg.AuthInfos["token"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[c.Name] = &clientcmdapi.Context{Cluster: c.Name, AuthInfo: "token"}
	cfg.CurrentContext = c.Name
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		panic(fmt.Sprintf("serialising a kubeconfig built in memory: %v", err))
	}
	return out
}

// AdminToken is a static bearer token with cluster-admin rights.
func (c *Cluster) AdminToken() string { return adminToken }

// StartAPIServer starts the cluster's API server (again) on its port. It does
// not wait for readiness; see WaitReady.
func (c *Cluster) StartAPIServer() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc != nil && c.proc.alive() {
		return nil
	}
	proc, err := c.startAPIServer(c.port, "apiserver-"+c.Name+".log")
	if err != nil {
		return err
	}
	c.proc = proc
	return nil
}

func (c *Cluster) startAPIServer(port int, logName string, extraArgs ...string) (*process, error) {
	p := c.env.pki
	args := append([]string{
		"--etcd-servers=" + c.env.etcdURL, "--etcd-prefix=/cluster-" + c.Name,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", port),
		"--tls-cert-file=" + p.serverCertFile, "--tls-private-key-file=" + p.serverKeyFile,
		"--client-ca-file=" + p.caFile, "--token-auth-file=" + p.tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.saPubFile, "--service-account-signing-key-file=" + p.saKeyFile,
		"--service-cluster-ip-range=10.0.0.0/16", "--endpoint-reconciler-type=none", "--profiling=false"},
		extraArgs...)
	proc, err := startProcess(filepath.Join(c.env.binDir, "kube-apiserver"), filepath.Join(c.env.dir, logName), args...)
	if err != nil {
		return nil, fmt.Errorf("starting API server %s: %w", c.Name, err)
	}
	return proc, nil
}

// StartSpareAPIServer starts a second API server for the same cluster (same
// etcd prefix) on another port, as in an HA control plane, and waits until
// it is ready. Tests use it to change a cluster while the hub's API server
// is down. The returned stop function stops the spare.
func (c *Cluster) StartSpareAPIServer(ctx context.Context) (*rest.Config, func(), error) {
	return c.startSpare(ctx, "spare")
}

// StartAuditedAPIServer starts a spare API server (as StartSpareAPIServer)
// that writes an audit log: every request its policy (an audit.k8s.io/v1
// Policy) selects, one JSON event per line, written before the request is
// answered (blocking mode). Tests point a client with restricted credentials
// at it and read what that client did and whether RBAC allowed it. The
// returned stop function stops the server.
func (c *Cluster) StartAuditedAPIServer(ctx context.Context, policy []byte) (cfg *rest.Config, auditLog string, stop func(), err error) {
	f, err := os.CreateTemp(c.env.dir, "audit-policy-*.yaml")
	if err != nil {
		return nil, "", nil, err
	}
	if _, err := f.Write(policy); err != nil {
		f.Close()
		return nil, "", nil, err
	}
	if err := f.Close(); err != nil {
		return nil, "", nil, err
	}
	auditLog = strings.TrimSuffix(f.Name(), ".yaml") + ".log"
	cfg, stop, err = c.startSpare(ctx, "audited", "--audit-policy-file="+f.Name(), "--audit-log-path="+auditLog,
		"--audit-log-format=json", "--audit-log-mode=blocking")
	return cfg, auditLog, stop, err
}

func (c *Cluster) startSpare(ctx context.Context, kind string, extraArgs ...string) (*rest.Config, func(), error) {
	port, err := freePort()
	if err != nil {
		return nil, nil, err
	}
	proc, err := c.startAPIServer(port, fmt.Sprintf("apiserver-%s-%s-%d.log", c.Name, kind, port), extraArgs...)
	if err != nil {
		return nil, nil, err
	}
	cfg := c.RESTConfig()
	cfg.Host = fmt.Sprintf("https://127.0.0.1:%d", port)
	if err := c.waitReady(ctx, cfg.Host, proc); err != nil {
		proc.stop()
		return nil, nil, err
	}
	return cfg, proc.stop, nil
}

// StopAPIServer stops the cluster's API server (a paused one too); etcd
// keeps its data, so StartAPIServer brings the same cluster back.
func (c *Cluster) StopAPIServer() {
	c.mu.Lock()
	proc := c.proc
	c.mu.Unlock()
	if proc != nil {
		if proc.alive() {
			_ = proc.cmd.Process.Signal(syscall.SIGCONT) // a stopped process cannot act on SIGTERM
		}
		proc.stop()
	}
}

// PauseAPIServer freezes the cluster's API server (SIGSTOP): connections
// are still accepted by the kernel but nothing is answered, as with a
// blackholed member. ResumeAPIServer undoes it.
func (c *Cluster) PauseAPIServer() error {
	c.mu.Lock()
	proc := c.proc
	c.mu.Unlock()
	if proc == nil || !proc.alive() {
		return fmt.Errorf("pausing API server %s: it is not running", c.Name)
	}
	if err := proc.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pausing API server %s: %w", c.Name, err)
	}
	return nil
}

// ResumeAPIServer lets a paused API server run again.
func (c *Cluster) ResumeAPIServer() error {
	c.mu.Lock()
	proc := c.proc
	c.mu.Unlock()
	if proc == nil || !proc.alive() {
		return nil
	}
	if err := proc.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("resuming API server %s: %w", c.Name, err)
	}
	return nil
}

// APIServerPID is the process ID of the cluster's API server, or 0 when
// none runs (the demo prints it for people to pause the member).
func (c *Cluster) APIServerPID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil || !c.proc.alive() {
		return 0
	}
	return c.proc.cmd.Process.Pid
}

// WaitReady waits until the API server answers /readyz.
func (c *Cluster) WaitReady(ctx context.Context) error {
	c.mu.Lock()
	proc := c.proc
	c.mu.Unlock()
	return c.waitReady(ctx, c.Server(), proc)
}

func (c *Cluster) waitReady(ctx context.Context, server string, proc *process) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.env.pki.caPEM)
	cert, err := tls.X509KeyPair(c.env.pki.adminCertPEM, c.env.pki.adminKeyPEM)
	if err != nil {
		return fmt.Errorf("loading admin certificate: %w", err)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}},
	}}
	defer client.CloseIdleConnections()
	if err := waitHTTP(ctx, client, server+"/readyz", proc, 120*time.Second); err != nil {
		return fmt.Errorf("API server %s: %w", c.Name, err)
	}
	return nil
}

// process is a child process that dies with us (Pdeathsig) and is stopped
// with SIGTERM, then SIGKILL.
type process struct {
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	once    sync.Once
}

func startProcess(bin, logPath string, args ...string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening log %s: %w", logPath, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", filepath.Base(bin), err)
	}
	p := &process{cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *process) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *process) stop() {
	p.once.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	})
}

// tail returns the last lines of the process log, for error messages.
func (p *process) tail() string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return ""
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}

func waitHTTP(ctx context.Context, client *http.Client, url string, proc *process, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if proc != nil && !proc.alive() {
			return fmt.Errorf("process exited before %s was ready; log tail:\n%s", url, proc.tail())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w", url, ctx.Err())
		case <-tick.C:
		}
	}
}

// handedOut holds every port freePort returned in this process. The kernel
// may hand out a just-released port again, and all API servers of an Env
// share one PKI: a second server that failed to bind a port the first one
// holds would look ready (the first answers for it), and two members would
// silently share one API server. So a port is never handed out twice.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

func freePort() (int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("finding a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !handedOut.ports[port] {
			handedOut.ports[port] = true
			return port, nil
		}
	}
	return 0, errors.New("finding a free port: the kernel kept offering ports already handed out")
}
