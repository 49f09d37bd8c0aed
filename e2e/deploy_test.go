package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/trust"
)

const (
	deployNS      = "hub-system"   // the hub's own namespace in deploy/
	secretsNS     = "istio-system" // where deploy/ lets it read the remote Secrets
	deployManager = "hub-deploy-e2e"
	// The identity remote-member-rbac.yaml binds (istioctl's remote secrets).
	memberSA = "istio-reader-service-account"
)

// TestDeploy applies deploy/ with the real kubectl to a real API server, then
// runs the real hub with nothing but the ServiceAccount token that base
// creates and the Deployment's own flags (plaintext xDS off): it must become
// ready, federate the home cluster and a member registered through its API
// (a remote Secret in istio-system, with a token limited to
// remote-member-rbac.yaml), write its Secrets, ConfigMaps and Events, and
// never be forbidden anything but the home cluster's Secrets (opt-in:
// home-sds-rbac.yaml); SubjectAccessReviews pin down what it must not be able
// to do. The example istiod mesh config names the Service's TLS port by a
// name on the hub's certificate.
func TestDeploy(t *testing.T) {
	e := localcluster.Require(t, env)
	ctx := testContext(t)
	home, west := e.Cluster("primary"), e.Cluster("west")
	homeClient, westClient := client(t, home), client(t, west)
	binDir, err := localcluster.BinDir(ctx)
	if err != nil {
		t.Fatalf("kubectl is needed: %v", err)
	}
	deployDir, err := filepath.Abs(filepath.Join("..", "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	homeKubectl := kubectlFor(t, filepath.Join(binDir, "kubectl"), writeTemp(t, dir, "primary.kubeconfig", home.Kubeconfig()))
	westKubectl := kubectlFor(t, filepath.Join(binDir, "kubectl"), writeTemp(t, dir, "west.kubeconfig", west.Kubeconfig()))

	// 1. The base applies for real (server-side, strict field validation) and
	// every object it lists is there.
	requireListedManifests(t, deployDir)
	byNamespace := map[string][]string{ // "" is cluster-scoped
		deployNS: {
			"serviceaccount/hub",
			"role.rbac.authorization.k8s.io/hub",
			"rolebinding.rbac.authorization.k8s.io/hub",
			"service/hub",
			"service/hub-bundle",
			"deployment.apps/hub",
			"poddisruptionbudget.policy/hub",
			"networkpolicy.networking.k8s.io/hub",
		},
		secretsNS: {
			"role.rbac.authorization.k8s.io/hub-remote-secrets",
			"rolebinding.rbac.authorization.k8s.io/hub-remote-secrets",
			"role.rbac.authorization.k8s.io/hub-gateways",
			"rolebinding.rbac.authorization.k8s.io/hub-gateways",
		},
		"": {
			"namespace/" + deployNS,
			"clusterrole.rbac.authorization.k8s.io/hub",
			"clusterrolebinding.rbac.authorization.k8s.io/hub",
		},
	}
	var want []string
	for _, names := range byNamespace {
		want = append(want, names...)
	}
	t.Cleanup(func() {
		// Everything but the namespace: other tests use hub-system, and
		// without a controller-manager a deleted namespace never goes away.
		for ns, names := range byNamespace {
			var objs []string
			for _, n := range names {
				if !strings.HasPrefix(n, "namespace/") {
					objs = append(objs, n)
				}
			}
			args := []string{"delete", "--ignore-not-found", "--wait=false"}
			if ns != "" {
				args = append(args, "-n", ns)
			}
			homeKubectl(context.Background(), append(args, objs...)...)
		}
	})
	// istio-system is Istio's: the base does not create it (namespace.yaml).
	if err := localcluster.EnsureNamespace(ctx, homeClient, secretsNS); err != nil {
		t.Fatal(err)
	}
	homeKubectl(ctx, "apply", "-k", deployDir, "--server-side", "--field-manager="+deployManager)
	got := strings.Fields(homeKubectl(ctx, "get", "-k", deployDir, "-o", "name"))
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("objects of the kustomization read back:\n  %v\nwant\n  %v", got, want)
	}
	dep, err := homeClient.AppsV1().Deployments(deployNS).Get(ctx, "hub", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	requireRestrictedPodSecurity(t, ctx, homeClient, dep.Spec.Template)

	// The member-side RBAC is valid for a member's API server.
	// (Its Role for gateway Services lives in istio-system, Istio's.)
	memberRBAC := filepath.Join(deployDir, "remote-member-rbac.yaml")
	if err := localcluster.EnsureNamespace(ctx, westClient, secretsNS); err != nil {
		t.Fatal(err)
	}
	westKubectl(ctx, "apply", "--dry-run=server", "-f", memberRBAC)

	// 2. The real hub with the ServiceAccount's token, and the Deployment's
	// own arguments (so the binary must accept them), addresses and log level
	// overridden for the test.
	exp := int64(3600)
	tok, err := homeClient.CoreV1().ServiceAccounts(deployNS).CreateToken(ctx, "hub",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	args := dep.Spec.Template.Spec.Containers[0].Args
	for _, flag := range []string{"--xds-addr=", "--xds-tls-addr=:15012", "--admin-addr=:8080", "--bundle-addr=:8443", "--remote-secrets-namespace=" + secretsNS} {
		if !slices.Contains(args, flag) {
			t.Errorf("Deployment args %q lack %s (plaintext xDS off, docs/architecture.md §3.1, §3.7)", args, flag)
		}
	}
	dnsNames, _ := flagValue(args, "--tls-dns-names")
	requireIstiodExample(t, deployDir, strings.Split(dnsNames, ","))
	// The Deployment's --xds-addr= stays: the hub runs without plaintext xDS.
	args = append(slices.Clone(args),
		"--kubeconfig", writeTemp(t, dir, "hub-sa.kubeconfig", home.TokenKubeconfig(tok.Status.Token)),
		"--namespace", deployNS, "--cluster-id", home.Name, "--xds-tls-addr", "127.0.0.1:0",
		"--admin-addr", "127.0.0.1:0", "--bundle-addr", "127.0.0.1:0", "--log-level", "debug")
	podName := "hub-deploy-e2e-" + rand.String(5)
	t.Setenv("POD_NAME", podName)   // the leader-election identity, from the downward API in the Deployment
	h := startHub(t, home, args...) // waits for /readyz 200
	if h.addrs["xds"] != "" || h.addrs["xds-tls"] == "" {
		t.Errorf("listeners %v; want xds-tls and no plaintext xds", h.addrs)
	}
	eventually(t, 30*time.Second, func() error {
		if c := h.clusters(t)[home.Name]; c.State != "Ready" {
			return fmt.Errorf("home cluster %s is %q (%s), want Ready", home.Name, c.State, c.Message)
		}
		return nil
	})
	// It leads (another test's hub may have left the Lease held: wait for it
	// to expire).
	eventually(t, 40*time.Second, func() error {
		if holder := leaseHolder(ctx, homeClient); holder != podName {
			return fmt.Errorf("Lease %s/hub-leader is held by %q, want %q", deployNS, holder, podName)
		}
		return nil
	})

	// A member registered through the API (remote Secret created in
	// istio-system), whose credentials have only remote-member-rbac.yaml.
	// (The member's istio-reader-service-account lives in its istio-system.)
	westKubectl(ctx, "apply", "--server-side", "--field-manager="+deployManager, "-f", memberRBAC)
	if _, err := westClient.CoreV1().ServiceAccounts(secretsNS).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: memberSA}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	memberTok, err := westClient.CoreV1().ServiceAccounts(secretsNS).CreateToken(ctx, memberSA,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const remoteSecret = "istio-remote-secret-west" // the Registrar's name for "west"
	t.Cleanup(func() {
		_ = homeClient.CoreV1().Secrets(secretsNS).Delete(context.Background(), remoteSecret, metav1.DeleteOptions{})
	})
	body, _ := json.Marshal(map[string]string{"id": west.Name, "kubeconfig": string(west.TokenKubeconfig(memberTok.Status.Token))})
	if code, resp := h.do(t, http.MethodPost, "/api/v1/clusters", string(body)); code != http.StatusCreated && code != http.StatusOK {
		t.Fatalf("POST /api/v1/clusters: %d %s", code, resp)
	}
	eventually(t, 30*time.Second, func() error {
		if c := h.clusters(t)[west.Name]; c.State != "Ready" {
			return fmt.Errorf("member %s is %q (%s), want Ready", west.Name, c.State, c.Message)
		}
		return nil
	})
	eventually(t, 30*time.Second, func() error { // Events on the remote Secret
		evs, err := homeClient.CoreV1().Events(secretsNS).List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.name": remoteSecret, "reason": "ClusterReady"}.AsSelector().String()})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Source.Component == "hub" {
				return nil
			}
		}
		return fmt.Errorf("no ClusterReady Event from the hub on %s/%s yet", secretsNS, remoteSecret)
	})
	if code, resp := h.do(t, http.MethodDelete, "/api/v1/clusters/"+west.Name, ""); code != http.StatusNoContent {
		t.Fatalf("DELETE /api/v1/clusters/%s: %d %s", west.Name, code, resp)
	}
	if _, err := homeClient.CoreV1().Secrets(secretsNS).Get(ctx, remoteSecret, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("remote Secret after DELETE: %v, want NotFound", err)
	}
	eventually(t, 30*time.Second, func() error {
		if _, ok := h.clusters(t)[west.Name]; ok {
			return fmt.Errorf("member %s still listed after DELETE", west.Name)
		}
		return nil
	})

	// A federation relationship: its ConfigMap is written and deleted. The
	// bundle endpoint is a closed port on this machine; the fetch just fails.
	const peerTD = "deploy-peer.example"
	peer := `{"bundleEndpointURL":"https://127.0.0.1:1/bundle","profile":"https_web"}`
	if code, resp := h.do(t, http.MethodPut, "/api/v1/trustdomains/"+peerTD, peer); code != http.StatusCreated && code != http.StatusOK {
		t.Fatalf("PUT /api/v1/trustdomains/%s: %d %s", peerTD, code, resp)
	}
	if _, err := homeClient.CoreV1().ConfigMaps(deployNS).Get(ctx, trust.PeerConfigMapName(spiffeid.RequireTrustDomainFromString(peerTD)), metav1.GetOptions{}); err != nil {
		t.Fatalf("federation ConfigMap: %v", err)
	}
	if code, resp := h.do(t, http.MethodDelete, "/api/v1/trustdomains/"+peerTD, ""); code != http.StatusNoContent {
		t.Fatalf("DELETE /api/v1/trustdomains/%s: %d %s", peerTD, code, resp)
	}

	// Nothing the hub did was forbidden (client-go logs refused list/watch
	// and Event writes; the hub logs failed reads and writes) but the home
	// cluster's Secrets for SDS, which the base does not grant.
	h.stop(t)
	if holder := leaseHolder(ctx, homeClient); holder == podName {
		t.Errorf("Lease %s/hub-leader still held by the stopped hub %q, want it released", deployNS, holder)
	}
	logData, err := os.ReadFile(h.logPath)
	if err != nil {
		t.Fatal(err)
	}
	forbidden := regexp.MustCompile(`(?i)forbidden`)
	homeSecrets := regexp.MustCompile(`cannot (list|watch) resource \\?"secrets\\?" in API group \\?"\\?" at the cluster scope`)
	// Events on objects labelled for distribution in namespaces the hub
	// may not write Events to (other tests' objects in this shared home
	// cluster): deploy/rbac.yaml says those rejections are logged.
	foreignEvents := regexp.MustCompile(`"msg":"recording an Event failed".*"namespace":"([^"]+)".*cannot create resource \\?"events\\?"`)
	foreign := func(line string) bool {
		m := foreignEvents.FindStringSubmatch(line)
		return m != nil && m[1] != deployNS && m[1] != "istio-system"
	}
	tolerated := 0
	for _, line := range strings.Split(string(logData), "\n") {
		if homeSecrets.MatchString(line) {
			tolerated++
		}
		if forbidden.MatchString(line) && !homeSecrets.MatchString(line) && !foreign(line) {
			t.Errorf("hub was forbidden something with the deploy/ RBAC: %s", line)
		}
	}
	// The one refusal the base means: the home cluster's Secrets (opt-in).
	if tolerated == 0 {
		t.Error("the hub's log shows no forbidden list/watch of the home cluster's Secrets: does the base grant them?")
	}
	t.Logf("%d log lines of the home cluster's Secrets watch being forbidden (home-sds-rbac.yaml is opt-in)", tolerated)

	// 3. ... and it may do no more than it needs.
	requireAccess(t, ctx, homeClient, "system:serviceaccount:"+deployNS+":hub", deployNS, []access{
		// Leader election: only the Lease hub-leader.
		{allow: true, verb: "create", group: "coordination.k8s.io", resource: "leases", ns: deployNS},
		{allow: true, verb: "get", group: "coordination.k8s.io", resource: "leases", ns: deployNS, name: "hub-leader"},
		{allow: true, verb: "update", group: "coordination.k8s.io", resource: "leases", ns: deployNS, name: "hub-leader"},
		{allow: false, verb: "update", group: "coordination.k8s.io", resource: "leases", ns: deployNS, name: "other"},
		{allow: false, verb: "delete", group: "coordination.k8s.io", resource: "leases", ns: deployNS, name: "hub-leader"},
		{allow: false, verb: "update", group: "coordination.k8s.io", resource: "leases", ns: "kube-system", name: "kube-controller-manager"},
		// Events: on the remote Secrets, the root namespace's objects and
		// the hub's own (refused persisted views) only.
		{allow: true, verb: "patch", resource: "events", ns: secretsNS},
		{allow: true, verb: "create", resource: "events", ns: secretsNS},
		{allow: true, verb: "create", resource: "events", ns: deployNS},
		{allow: false, verb: "create", resource: "events", ns: "kube-system"},
		// Its own Secrets: by name, but for create (RBAC cannot restrict it).
		{allow: true, verb: "get", resource: "secrets", ns: deployNS, name: "hub-trust-state"},
		{allow: false, verb: "update", resource: "secrets", ns: deployNS, name: "hub-view-key"},
		{allow: false, verb: "update", resource: "secrets", ns: deployNS, name: "anything"},
		{allow: false, verb: "delete", resource: "secrets", ns: deployNS, name: "hub-trust-state"},
		{allow: false, verb: "patch", resource: "secrets", ns: deployNS, name: "hub-trust-state"},
		// Remote Secrets: read, and written for the API's registration; never
		// patched or deleted wholesale.
		{allow: true, verb: "list", resource: "secrets", ns: secretsNS},
		{allow: true, verb: "create", resource: "secrets", ns: secretsNS},
		{allow: false, verb: "patch", resource: "secrets", ns: secretsNS, name: "anything"},
		{allow: false, verb: "deletecollection", resource: "secrets", ns: secretsNS},
		// No Secret of any other namespace, not even by list (home-sds-rbac.yaml
		// is opt-in).
		{allow: false, verb: "list", resource: "secrets"},
		{allow: false, verb: "watch", resource: "secrets"},
		{allow: false, verb: "list", resource: "secrets", ns: "default"},
		{allow: false, verb: "get", resource: "secrets", ns: "kube-system", name: "anything"},
		{allow: false, verb: "delete", resource: "secrets", ns: "kube-system", name: "anything"},
		{allow: false, verb: "create", resource: "secrets", ns: "kube-system"},
		{allow: false, verb: "update", resource: "secrets", ns: "default", name: "anything"},
		// ConfigMaps: its own namespace only.
		{allow: true, verb: "update", resource: "configmaps", ns: deployNS, name: "anything"},
		{allow: false, verb: "update", resource: "configmaps", ns: "kube-system", name: "anything"},
		{allow: false, verb: "list", resource: "configmaps", ns: secretsNS},
		// Distributed Istio policy is read, never written.
		{allow: true, verb: "list", group: "security.istio.io", resource: "peerauthentications"},
		{allow: false, verb: "create", group: "security.istio.io", resource: "peerauthentications", ns: secretsNS},
		{allow: false, verb: "update", group: "networking.istio.io", resource: "virtualservices", ns: "default", name: "anything"},
		// Members' objects are read-only.
		{allow: false, verb: "update", resource: "nodes", name: "anything"},
		{allow: false, verb: "update", resource: "services", ns: "default", name: "kubernetes"},
		{allow: false, verb: "create", group: "discovery.k8s.io", resource: "endpointslices", ns: "default"},
		// Nothing else.
		// Pods: listed (metadata of the mesh's pods, clusters/meshpods.go),
		// never read one by one, never written.
		{allow: true, verb: "list", resource: "pods"},
		{allow: false, verb: "get", resource: "pods", ns: deployNS},
		{allow: false, verb: "create", resource: "pods", ns: deployNS},
		{allow: false, verb: "delete", resource: "pods", ns: deployNS},
		// Services: written only in istio-system (other networks' gateways for
		// the home cluster's istiod, clusters/gatewayexport.go).
		{allow: true, verb: "create", resource: "services", ns: "istio-system"},
		{allow: false, verb: "create", resource: "services", ns: deployNS},
		{allow: false, verb: "create", resource: "services", ns: "default"},
		{allow: false, verb: "create", resource: "serviceaccounts", subresource: "token", ns: deployNS, name: "hub"},
		{allow: false, verb: "create", resource: "namespaces"},
		{allow: false, verb: "create", group: "rbac.authorization.k8s.io", resource: "clusterroles"},
		{allow: false, verb: "create", group: "rbac.authorization.k8s.io", resource: "rolebindings", ns: deployNS},
		{allow: false, verb: "impersonate", resource: "users", name: "admin"},
	})
}

// kubectlFor returns a runner of the real kubectl against one kubeconfig
// that fails the test unless kubectl exits 0, and returns its stdout.
func kubectlFor(t *testing.T, bin, kubeconfig string) func(ctx context.Context, args ...string) string {
	return func(ctx context.Context, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("kubectl %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, out, stderr.String())
		}
		t.Logf("kubectl %s:\n%s%s", strings.Join(args, " "), out, stderr.String())
		return string(out)
	}
}

func writeTemp(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// requireListedManifests checks that kustomization.yaml lists every manifest
// in deploy/ except the two that are applied elsewhere.
func requireListedManifests(t *testing.T, deployDir string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(deployDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Namespace string   `json:"namespace"`
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if k.Namespace != "" {
		t.Errorf("kustomization namespace %q; want none (rbac.yaml spans %s and %s, each object names its own)", k.Namespace, deployNS, secretsNS)
	}
	files, err := filepath.Glob(filepath.Join(deployDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	notInBase := []string{"kustomization.yaml", "remote-secret-example.yaml", "remote-member-rbac.yaml", "home-sds-rbac.yaml", "istiod-meshconfig-example.yaml"}
	for _, f := range files {
		name := filepath.Base(f)
		if slices.Contains(k.Resources, name) == slices.Contains(notInBase, name) {
			t.Errorf("deploy/%s: in kustomization resources = %v, want %v", name, slices.Contains(k.Resources, name), !slices.Contains(notInBase, name))
		}
	}
}

// requireIstiodExample checks deploy/istiod-meshconfig-example.yaml: its
// hub config source is the Service's TLS port over SIMPLE TLS, checked
// (sni, subjectAltNames) for a name on the hub's certificate (dnsNames, the
// Deployment's --tls-dns-names), as e2e/istiod_mcp_test.go runs it.
func requireIstiodExample(t *testing.T, deployDir string, dnsNames []string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(deployDir, "istiod-meshconfig-example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(data, &cm); err != nil {
		t.Fatalf("istiod-meshconfig-example.yaml: %v", err)
	}
	var mesh struct {
		ConfigSources []istiodConfigSource `json:"configSources"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["mesh"]), &mesh); err != nil {
		t.Fatalf("istiod-meshconfig-example.yaml mesh: %v", err)
	}
	var hub *istiodConfigSource
	for i, src := range mesh.ConfigSources {
		if strings.HasPrefix(src.Address, "xds://") {
			hub = &mesh.ConfigSources[i]
		}
	}
	if hub == nil || len(mesh.ConfigSources) != 2 || mesh.ConfigSources[0].Address != "k8s://" {
		t.Fatalf("example configSources %+v; want k8s:// first, then the hub's xds://", mesh.ConfigSources)
	}
	sans, _ := hub.TLSSettings["subjectAltNames"].([]any)
	if hub.Address != "xds://hub."+deployNS+".svc:15012" || hub.TLSSettings["mode"] != "SIMPLE" ||
		!slices.Contains(dnsNames, fmt.Sprint(hub.TLSSettings["sni"])) || len(sans) == 0 ||
		!strings.Contains(fmt.Sprint(hub.TLSSettings["caCertificates"]), "BEGIN CERTIFICATE") {
		t.Errorf("example hub config source %+v; want xds://hub.%s.svc:15012, mode SIMPLE, caCertificates, sni and subjectAltNames among %v", hub, deployNS, dnsNames)
	}
	for _, san := range sans {
		if !slices.Contains(dnsNames, fmt.Sprint(san)) {
			t.Errorf("example subjectAltNames %v: %v is not on the hub's certificate (%v)", sans, san, dnsNames)
		}
	}
}

// requireRestrictedPodSecurity admits (dry run) a Pod of the Deployment's
// template in a namespace that enforces the "restricted" Pod Security
// Standard.
func requireRestrictedPodSecurity(t *testing.T, ctx context.Context, cs kubernetes.Interface, tmpl corev1.PodTemplateSpec) {
	t.Helper()
	ns := "e2e-pss-" + rand.String(6)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: tmpl.Spec.ServiceAccountName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: *tmpl.ObjectMeta.DeepCopy(), Spec: *tmpl.Spec.DeepCopy()}
	pod.Name = "hub-pss"
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatalf("the Deployment's pod is not admitted under the restricted Pod Security Standard: %v", err)
	}
}

// leaseHolder is the holder of the hub's leader Lease, or "error: ...".
func leaseHolder(ctx context.Context, cs kubernetes.Interface) string {
	l, err := cs.CoordinationV1().Leases(deployNS).Get(ctx, "hub-leader", metav1.GetOptions{})
	if err != nil {
		return "error: " + err.Error()
	}
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

type access struct {
	allow                                  bool
	verb, group, resource, subresource, ns string
	name                                   string
}

// requireAccess asks the API server (SubjectAccessReview) whether a service
// account may do each thing.
func requireAccess(t *testing.T, ctx context.Context, cs kubernetes.Interface, user, saNS string, checks []access) {
	t.Helper()
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + saNS, "system:authenticated"}
	for _, c := range checks {
		sar, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: groups, ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: c.verb, Group: c.group, Resource: c.resource, Subresource: c.subresource, Namespace: c.ns, Name: c.name,
			}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed != c.allow {
			t.Errorf("%s may %s %s/%s %s in namespace %q (name %q): %v, want %v (%s)",
				user, c.verb, c.group, c.resource, c.subresource, c.ns, c.name, sar.Status.Allowed, c.allow, sar.Status.Reason)
		}
	}
}
