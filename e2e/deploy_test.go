package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/hubmesh/hub/charts/charttest"
	"github.com/hubmesh/hub/distribute"
	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/trust"
)

const (
	deployNS      = "hub-system"   // the hub's own namespace in deploy/
	secretsNS     = "istio-system" // where deploy/ lets it read the remote Secrets
	deployManager = "hub-deploy-e2e"
	// The identity remote-member-rbac.yaml creates and binds.
	memberSA = "hub-member-reader"
)

// deployment is one way of installing the hub that TestDeploy proves: the
// manifests for the home cluster and for a member, and the names they use.
type deployment struct {
	home, member []manifest // applied to the home cluster and to the member
	// ns and sa are the hub's namespace and ServiceAccount; remoteNS and
	// rootNS its --remote-secrets-namespace and --root-namespace.
	ns, sa, remoteNS, rootNS string
	// memberNS and memberSA: the identity of the member's remote Secret.
	memberNS, memberSA string
	// deployDir: deploy/, whose other files are checked too.
	deployDir string
}

// TestDeploy installs the hub as its users do, with the real kubectl
// (server-side apply) on real API servers: deploy/ (kustomize), and the Helm
// chart charts/hub rendered by the real helm with ci/canary-values.yaml (one
// replica, a revision, its own namespace, remote Secrets and root namespace
// elsewhere; charts/chart_deploy_test.go proves the default render equal to
// deploy/), and ci/full-values.yaml applied too. Each time it then runs the
// real hub with nothing but a TokenRequest token of the installed
// ServiceAccount and the Deployment's own flags, against API servers that
// write an audit log: it must become ready, lead (Lease), federate the home
// cluster and a member registered, re-registered and removed through its API
// (a remote Secret whose token is the member RBAC's identity's), persist the
// member views, distribute and reject Istio policy (Events), write and delete
// a federation ConfigMap. The audit logs then prove the RBAC exact: nothing
// the hub or its member identity asked was forbidden (but the home cluster's
// Secrets, opt-in), and every verb the Roles grant was used, so that any
// verb taken away fails this test (requireAudited). SubjectAccessReviews pin
// down what the hub must not be able to do.
func TestDeploy(t *testing.T) {
	e := localcluster.Require(t, env)
	ctx := testContext(t)
	home, west := e.Cluster("primary"), e.Cluster("west")
	binDir, err := localcluster.BinDir(ctx)
	if err != nil {
		t.Fatalf("kubectl is needed: %v", err)
	}
	dir := t.TempDir()
	homeKubeconfig := writeTemp(t, dir, "primary.kubeconfig", home.Kubeconfig())
	westKubeconfig := writeTemp(t, dir, "west.kubeconfig", west.Kubeconfig())
	kubectls := func(t *testing.T) (homeKubectl, westKubectl func(context.Context, ...string) string) {
		return kubectlFor(t, filepath.Join(binDir, "kubectl"), homeKubeconfig), kubectlFor(t, filepath.Join(binDir, "kubectl"), westKubeconfig)
	}

	t.Run("deploy", func(t *testing.T) {
		homeKubectl, westKubectl := kubectls(t)
		deployDir, err := filepath.Abs(filepath.Join("..", "deploy"))
		if err != nil {
			t.Fatal(err)
		}
		requireListedManifests(t, deployDir)
		memberRBAC, err := os.ReadFile(filepath.Join(deployDir, "remote-member-rbac.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		runDeployment(t, home, west, homeKubectl, westKubectl, deployment{
			home:   charttest.Split(t, []byte(homeKubectl(ctx, "kustomize", deployDir))),
			member: charttest.Split(t, memberRBAC),
			ns:     deployNS, sa: "hub", remoteNS: secretsNS, rootNS: secretsNS,
			memberNS: secretsNS, memberSA: memberSA,
			deployDir: deployDir,
		})
	})
	t.Run("chart", func(t *testing.T) {
		homeKubectl, westKubectl := kubectls(t)
		// The chart with everything optional on applies too (its
		// ServiceMonitor and PrometheusRule need prometheus-operator's CRDs:
		// minimal ones here, so only their envelope is validated).
		fullNS := "hub-full-" + rand.String(5)
		full := charttest.Split(t, charttest.Template(t, "hub", fullNS, "-f", "hub/ci/full-values.yaml"))
		applyRender(t, ctx, homeKubectl, client(t, home), fullNS, append(monitoringCRDs(t), full...), "")

		ns := "hub-chart-" + rand.String(5)
		memberNS := "hub-member-" + rand.String(5)
		canary := charttest.Template(t, "hub", ns, "-f", "hub/ci/canary-values.yaml")
		member := charttest.Template(t, "hub-member", memberNS, "--set", "revision=canary,serviceAccount.name=hub-canary-reader")
		runDeployment(t, home, west, homeKubectl, westKubectl, deployment{
			home: charttest.Split(t, canary), member: charttest.Split(t, member),
			ns: ns, sa: "hub-canary", remoteNS: "hub-e2e-remote", rootNS: "hub-e2e-root",
			memberNS: memberNS, memberSA: "hub-canary-reader",
		})
	})
}

// monitoringCRDs are minimal CustomResourceDefinitions of
// prometheus-operator's ServiceMonitor and PrometheusRule (any spec).
func monitoringCRDs(t *testing.T) []manifest {
	var b strings.Builder
	for _, k := range [][2]string{{"ServiceMonitor", "servicemonitors"}, {"PrometheusRule", "prometheusrules"}} {
		fmt.Fprintf(&b, `---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: %[2]s.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: %[1]s, plural: %[2]s, listKind: %[1]sList, singular: %[3]s}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
`, k[0], k[1], strings.ToLower(k[0]))
	}
	return charttest.Split(t, []byte(b.String()))
}

// applyRender applies manifests server-side (strict field validation) after
// creating ns (helm install --create-namespace) when given, checks every
// object reads back, and deletes them at cleanup (but Namespaces: without a
// controller-manager a deleted namespace never goes away, and other tests
// share hub-system and istio-system).
func applyRender(t *testing.T, ctx context.Context, kubectl func(context.Context, ...string) string, cs kubernetes.Interface, ns string, ms []manifest, dir string) {
	t.Helper()
	if ns != "" {
		if err := localcluster.EnsureNamespace(ctx, cs, ns); err != nil {
			t.Fatal(err)
		}
	}
	// Namespaces the objects need but do not create (istio-system is Istio's).
	for _, m := range ms {
		if m.NS != "" && !slices.ContainsFunc(ms, func(o manifest) bool { return o.Kind == "Namespace" && o.Name == m.NS }) {
			if err := localcluster.EnsureNamespace(ctx, cs, m.NS); err != nil {
				t.Fatal(err)
			}
		}
	}
	if dir == "" {
		dir = t.TempDir()
	}
	var crds, rest, deletable []manifest
	for _, m := range ms {
		switch m.Kind {
		case "CustomResourceDefinition":
			crds = append(crds, m)
		default:
			rest = append(rest, m)
		}
		if m.Kind != "Namespace" {
			deletable = append(deletable, m)
		}
	}
	file := writeTemp(t, dir, "render-"+rand.String(5)+".yaml", charttest.Join(rest))
	t.Cleanup(func() {
		if len(deletable) > 0 {
			kubectl(context.Background(), "delete", "--ignore-not-found", "--wait=false", "-f",
				writeTemp(t, dir, "delete-"+rand.String(5)+".yaml", charttest.Join(deletable)))
		}
	})
	if len(crds) > 0 {
		crdFile := writeTemp(t, dir, "crds-"+rand.String(5)+".yaml", charttest.Join(crds))
		kubectl(ctx, "apply", "--server-side", "--field-manager="+deployManager, "-f", crdFile)
		kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s", "-f", crdFile)
	}
	kubectl(ctx, "apply", "--server-side", "--field-manager="+deployManager, "-f", file)
	got := strings.Fields(kubectl(ctx, "get", "-f", file, "-o", "name"))
	if len(got) != len(rest) {
		t.Fatalf("%d objects read back, %d applied: %v", len(got), len(rest), got)
	}
}

// runDeployment is TestDeploy for one installation.
func runDeployment(t *testing.T, home, west *localcluster.Cluster, homeKubectl, westKubectl func(context.Context, ...string) string, d deployment) {
	ctx := testContext(t)
	homeClient, westClient := client(t, home), client(t, west)
	dir := t.TempDir()

	// 1. The manifests apply for real (server-side, strict field
	// validation) and every object reads back. istio-system is Istio's:
	// neither deploy/ nor the chart creates it (namespace.yaml).
	for _, ns := range []string{"istio-system", d.remoteNS, d.rootNS} {
		if err := localcluster.EnsureNamespace(ctx, homeClient, ns); err != nil {
			t.Fatal(err)
		}
	}
	releaseNS := d.ns
	if slices.ContainsFunc(d.home, func(m manifest) bool { return m.Kind == "Namespace" && m.Name == d.ns }) {
		releaseNS = "" // deploy/ creates its own
	}
	applyRender(t, ctx, homeKubectl, homeClient, releaseNS, d.home, dir)
	depName := d.sa // the Deployment and its ServiceAccount share the name
	dep, err := homeClient.AppsV1().Deployments(d.ns).Get(ctx, depName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	requireRestrictedPodSecurity(t, ctx, homeClient, dep.Spec.Template)
	// The member-side RBAC, in the member (its gateway Role in istio-system).
	if err := localcluster.EnsureNamespace(ctx, westClient, "istio-system"); err != nil {
		t.Fatal(err)
	}
	applyRender(t, ctx, westKubectl, westClient, d.memberNS, d.member, dir)

	// 2. API servers of both clusters that audit the hub's and the member
	// identity's requests.
	hubUser := "system:serviceaccount:" + d.ns + ":" + d.sa
	memberUser := "system:serviceaccount:" + d.memberNS + ":" + d.memberSA
	homeAudited, homeAudit, stopHomeAudited, err := home.StartAuditedAPIServer(ctx, auditPolicy(hubUser))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopHomeAudited)
	westAudited, westAudit, stopWestAudited, err := west.StartAuditedAPIServer(ctx, auditPolicy(memberUser))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopWestAudited)

	// 3. The real hub with the ServiceAccount's token, and the Deployment's
	// own arguments (so the binary must accept them), addresses and log level
	// overridden for the test.
	exp := int64(3600)
	tok, err := homeClient.CoreV1().ServiceAccounts(d.ns).CreateToken(ctx, d.sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	args := dep.Spec.Template.Spec.Containers[0].Args
	for _, flag := range []string{"--xds-addr=", "--xds-tls-addr=:15012", "--admin-addr=:8080", "--bundle-addr=:8443",
		"--remote-secrets-namespace=" + d.remoteNS, "--root-namespace=" + d.rootNS} {
		if !slices.Contains(args, flag) {
			t.Errorf("Deployment args %q lack %s (plaintext xDS off, docs/architecture.md §3.1, §3.7)", args, flag)
		}
	}
	dnsNames, _ := flagValue(args, "--tls-dns-names")
	if want := fmt.Sprintf("%[1]s.%[2]s.svc,%[1]s.%[2]s.svc.cluster.local,%[1]s.%[2]s", d.sa, d.ns); dnsNames != want {
		t.Errorf("--tls-dns-names=%s; want the Service's names %s", dnsNames, want)
	}
	if d.deployDir != "" {
		requireIstiodExample(t, d.deployDir, strings.Split(dnsNames, ","))
	}
	// A stale Lease of another test's hub would only delay leading; gone, the
	// hub creates it.
	if err := homeClient.CoordinationV1().Leases(d.ns).Delete(ctx, "hub-leader", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	installIstioCRDs(t, home) // distributed policy is authored in the home cluster
	// The Deployment's --xds-addr= stays: the hub runs without plaintext xDS.
	args = append(slices.Clone(args),
		"--kubeconfig", writeTemp(t, dir, "hub-sa.kubeconfig", home.TokenKubeconfigAt(homeAudited.Host, tok.Status.Token)),
		"--namespace", d.ns, "--cluster-id", home.Name, "--xds-tls-addr", "127.0.0.1:0",
		"--admin-addr", "127.0.0.1:0", "--bundle-addr", "127.0.0.1:0", "--log-level", "debug")
	// Informers list, then watch, as with API servers that do not stream
	// lists: with client-go's WatchListClient they only watch (and fall
	// back to a list where streaming is refused), which would leave list
	// unproven by the audit log.
	t.Setenv("KUBE_FEATURE_WatchListClient", "false")
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
	eventually(t, 40*time.Second, func() error {
		if holder := leaseHolder(ctx, homeClient, d.ns); holder != podName {
			return fmt.Errorf("Lease %s/hub-leader is held by %q, want %q", d.ns, holder, podName)
		}
		return nil
	})

	// A member registered through the API (remote Secret created in
	// remoteNS), whose credentials have only the member RBAC; registered
	// again with a new token (the Secret updated), as a rotation does.
	memberToken := func() string {
		tok, err := westClient.CoreV1().ServiceAccounts(d.memberNS).CreateToken(ctx, d.memberSA,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tok.Status.Token
	}
	const remoteSecret = "istio-remote-secret-west" // the Registrar's name for "west"
	t.Cleanup(func() {
		_ = homeClient.CoreV1().Secrets(d.remoteNS).Delete(context.Background(), remoteSecret, metav1.DeleteOptions{})
	})
	// Rotated twice, each rotation taken before the next: the second
	// KubeconfigRotated Event repeats the first, which client-go's recorder
	// patches (the Role's patch on events in remoteNS).
	for _, want := range []int{http.StatusCreated, http.StatusOK, http.StatusOK} {
		kubeconfig := west.TokenKubeconfigAt(westAudited.Host, memberToken())
		body, _ := json.Marshal(map[string]string{"id": west.Name, "kubeconfig": string(kubeconfig)})
		if code, resp := h.do(t, http.MethodPost, "/api/v1/clusters", string(body)); code != want {
			t.Fatalf("POST /api/v1/clusters: %d %s, want %d", code, resp, want)
		}
		sum := sha256.Sum256(kubeconfig)
		eventually(t, 30*time.Second, func() error {
			c := h.clusters(t)[west.Name]
			if c.State != "Ready" || c.KubeconfigSHA256 != hex.EncodeToString(sum[:]) {
				return fmt.Errorf("member %s is %q (%s) on kubeconfig %q, want Ready on the one just posted", west.Name, c.State, c.Message, c.KubeconfigSHA256)
			}
			return nil
		})
	}
	hubEvent := func(ns string, selector fields.Set) func() error {
		return func() error {
			evs, err := homeClient.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: selector.AsSelector().String()})
			if err != nil {
				return err
			}
			for _, ev := range evs.Items {
				if ev.Source.Component == "hub" {
					return nil
				}
			}
			return fmt.Errorf("no Event %v from the hub in %s yet", selector, ns)
		}
	}
	eventually(t, 30*time.Second, hubEvent(d.remoteNS, fields.Set{"involvedObject.name": remoteSecret, "reason": "ClusterReady"}))
	// The leader persists each member's view in its namespace.
	eventually(t, 30*time.Second, func() error {
		cms, err := homeClient.CoreV1().ConfigMaps(d.ns).List(ctx, metav1.ListOptions{LabelSelector: "hub.federation/member-view,hub.federation/cluster=" + west.Name})
		if err != nil {
			return err
		}
		for _, cm := range cms.Items {
			if cm.Labels["hub.federation/member-view-role"] == "manifest" {
				return nil
			}
		}
		return fmt.Errorf("no persisted view of %s in %s yet", west.Name, d.ns)
	})

	// Distribution from the root namespace: a PeerAuthentication is served;
	// a ServiceEntry claiming a federated host is refused with a
	// DistributionRejected Event there.
	app := "hub-deploy-app-" + rand.String(5)
	if err := localcluster.EnsureNamespace(ctx, westClient, app); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.ApplyService(ctx, westClient, app, "echo", "http", 8080, []localcluster.Backend{{IP: "198.18.51.1", Port: 8080}}); err != nil {
		t.Fatal(err)
	}
	dc, err := dynamic.NewForConfig(home.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	suffix := rand.String(5)
	paGVR := schema.GroupVersionResource{Group: "security.istio.io", Version: "v1", Resource: "peerauthentications"}
	seGVR := schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "serviceentries"}
	pa := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
		"metadata": map[string]any{"name": "deploy-" + suffix, "namespace": d.rootNS, "labels": map[string]any{distribute.Label: "true"}},
		"spec":     map[string]any{"mtls": map[string]any{"mode": "STRICT"}},
	}}
	shadow := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
		"metadata": map[string]any{"name": "shadow-" + suffix, "namespace": d.rootNS, "labels": map[string]any{distribute.Label: "true"}},
		"spec": map[string]any{"hosts": []any{"echo." + app + ".svc.clusterset.local"}, "location": "MESH_INTERNAL", "resolution": "STATIC",
			"ports": []any{map[string]any{"number": int64(8080), "name": "http", "protocol": "HTTP"}}},
	}}
	for _, o := range []struct {
		gvr schema.GroupVersionResource
		obj *unstructured.Unstructured
	}{{paGVR, pa}, {seGVR, shadow}} {
		if _, err := dc.Resource(o.gvr).Namespace(d.rootNS).Create(ctx, o.obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = dc.Resource(o.gvr).Namespace(d.rootNS).Delete(context.Background(), o.obj.GetName(), metav1.DeleteOptions{})
		})
	}
	eventually(t, 60*time.Second, func() error {
		var dist distribute.Status
		h.getJSON(t, "/api/v1/distribution", &dist)
		served, rejected := false, false
		for _, k := range dist.Kinds {
			if k.Kind == "security.istio.io/v1/PeerAuthentication" && k.Ready && k.Objects >= 1 {
				served = true
			}
			for _, r := range k.Rejected {
				if strings.Contains(fmt.Sprint(r), shadow.GetName()) {
					rejected = true
				}
			}
		}
		if !served || !rejected {
			return fmt.Errorf("distribution %+v: PeerAuthentication served %v, %s rejected %v", dist, served, shadow.GetName(), rejected)
		}
		return nil
	})
	eventually(t, 30*time.Second, hubEvent(d.rootNS, fields.Set{"involvedObject.name": shadow.GetName(), "reason": "DistributionRejected"}))

	// The member removed through the API: its Secret and view are deleted.
	if code, resp := h.do(t, http.MethodDelete, "/api/v1/clusters/"+west.Name, ""); code != http.StatusNoContent {
		t.Fatalf("DELETE /api/v1/clusters/%s: %d %s", west.Name, code, resp)
	}
	if _, err := homeClient.CoreV1().Secrets(d.remoteNS).Get(ctx, remoteSecret, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
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
	peerTD := "deploy-peer-" + suffix + ".example"
	// Put twice: created, then updated (another endpoint).
	for _, port := range []int{1, 2} {
		peer := fmt.Sprintf(`{"bundleEndpointURL":"https://127.0.0.1:%d/bundle","profile":"https_web"}`, port)
		if code, resp := h.do(t, http.MethodPut, "/api/v1/trustdomains/"+peerTD, peer); code != http.StatusCreated && code != http.StatusOK {
			t.Fatalf("PUT /api/v1/trustdomains/%s: %d %s", peerTD, code, resp)
		}
	}
	if _, err := homeClient.CoreV1().ConfigMaps(d.ns).Get(ctx, trust.PeerConfigMapName(spiffeid.RequireTrustDomainFromString(peerTD)), metav1.GetOptions{}); err != nil {
		t.Fatalf("federation ConfigMap: %v", err)
	}
	if code, resp := h.do(t, http.MethodDelete, "/api/v1/trustdomains/"+peerTD, ""); code != http.StatusNoContent {
		t.Fatalf("DELETE /api/v1/trustdomains/%s: %d %s", peerTD, code, resp)
	}

	// Every verb granted is used by now, or about to be (the last informers
	// start their watches right after their lists); then the hub stops.
	hubGrants, memberGrants := grantsOf(t, d.home, d.ns, d.sa), grantsOf(t, d.member, d.memberNS, d.memberSA)
	eventually(t, 30*time.Second, func() error {
		if missing := unused(readAudit(t, homeAudit, hubUser), hubGrants, hubUnexercised(d)); len(missing) > 0 {
			return fmt.Errorf("the hub has not used yet: %v", missing)
		}
		if missing := unused(readAudit(t, westAudit, memberUser), memberGrants, memberUnexercised(d)); len(missing) > 0 {
			return fmt.Errorf("the member identity has not been used for: %v", missing)
		}
		return nil
	})

	// Nothing the hub did was forbidden (client-go logs refused list/watch
	// and Event writes; the hub logs failed reads and writes) but the home
	// cluster's Secrets for SDS, which is opt-in.
	h.stop(t)
	if holder := leaseHolder(ctx, homeClient, d.ns); holder == podName {
		t.Errorf("Lease %s/hub-leader still held by the stopped hub %q, want it released", d.ns, holder)
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
		return m != nil && m[1] != d.ns && m[1] != d.remoteNS && m[1] != d.rootNS
	}
	tolerated := 0
	for _, line := range strings.Split(string(logData), "\n") {
		if homeSecrets.MatchString(line) {
			tolerated++
		}
		if forbidden.MatchString(line) && !homeSecrets.MatchString(line) && !foreign(line) {
			t.Errorf("hub was forbidden something with the installed RBAC: %s", line)
		}
	}
	if tolerated == 0 {
		t.Error("the hub's log shows no forbidden list/watch of the home cluster's Secrets: are they granted?")
	}

	// 4. The audit logs: nothing forbidden but that, every granted verb used.
	stopHomeAudited()
	stopWestAudited()
	requireAudited(t, "the hub ("+hubUser+")", readAudit(t, homeAudit, hubUser), hubGrants,
		func(e auditEvent) bool { // the home cluster's Secrets (opt-in)
			return e.ObjectRef != nil && e.ObjectRef.Resource == "secrets" && e.ObjectRef.Namespace == "" && (e.Verb == "list" || e.Verb == "watch")
		}, hubUnexercised(d))
	requireAudited(t, "the member identity ("+memberUser+")", readAudit(t, westAudit, memberUser), memberGrants,
		nil, memberUnexercised(d))

	// 5. ... and it may do no more than it needs.
	requireAccess(t, ctx, homeClient, hubUser, d.ns, []access{
		// Leader election: only the Lease hub-leader.
		{allow: true, verb: "create", group: "coordination.k8s.io", resource: "leases", ns: d.ns},
		{allow: true, verb: "get", group: "coordination.k8s.io", resource: "leases", ns: d.ns, name: "hub-leader"},
		{allow: true, verb: "update", group: "coordination.k8s.io", resource: "leases", ns: d.ns, name: "hub-leader"},
		{allow: false, verb: "update", group: "coordination.k8s.io", resource: "leases", ns: d.ns, name: "other"},
		{allow: false, verb: "delete", group: "coordination.k8s.io", resource: "leases", ns: d.ns, name: "hub-leader"},
		{allow: false, verb: "update", group: "coordination.k8s.io", resource: "leases", ns: "kube-system", name: "kube-controller-manager"},
		// Events: on the remote Secrets, the root namespace's objects and
		// the hub's own (refused persisted views) only.
		{allow: true, verb: "patch", resource: "events", ns: d.remoteNS},
		{allow: true, verb: "create", resource: "events", ns: d.remoteNS},
		{allow: true, verb: "create", resource: "events", ns: d.rootNS},
		{allow: true, verb: "create", resource: "events", ns: d.ns},
		{allow: false, verb: "create", resource: "events", ns: "kube-system"},
		// Its own Secrets: by name, but for create (RBAC cannot restrict it).
		{allow: true, verb: "get", resource: "secrets", ns: d.ns, name: "hub-trust-state"},
		{allow: false, verb: "update", resource: "secrets", ns: d.ns, name: "hub-view-key"},
		{allow: false, verb: "update", resource: "secrets", ns: d.ns, name: "anything"},
		{allow: false, verb: "delete", resource: "secrets", ns: d.ns, name: "hub-trust-state"},
		{allow: false, verb: "patch", resource: "secrets", ns: d.ns, name: "hub-trust-state"},
		// Remote Secrets: read, and written for the API's registration; never
		// patched or deleted wholesale.
		{allow: true, verb: "list", resource: "secrets", ns: d.remoteNS},
		{allow: true, verb: "create", resource: "secrets", ns: d.remoteNS},
		{allow: false, verb: "patch", resource: "secrets", ns: d.remoteNS, name: "anything"},
		{allow: false, verb: "deletecollection", resource: "secrets", ns: d.remoteNS},
		// No Secret of any other namespace, not even by list (home SDS is
		// opt-in).
		{allow: false, verb: "list", resource: "secrets"},
		{allow: false, verb: "watch", resource: "secrets"},
		{allow: false, verb: "list", resource: "secrets", ns: "default"},
		{allow: false, verb: "get", resource: "secrets", ns: "kube-system", name: "anything"},
		{allow: false, verb: "delete", resource: "secrets", ns: "kube-system", name: "anything"},
		{allow: false, verb: "create", resource: "secrets", ns: "kube-system"},
		{allow: false, verb: "update", resource: "secrets", ns: "default", name: "anything"},
		// ConfigMaps: its own namespace only.
		{allow: true, verb: "update", resource: "configmaps", ns: d.ns, name: "anything"},
		{allow: false, verb: "update", resource: "configmaps", ns: "kube-system", name: "anything"},
		{allow: false, verb: "list", resource: "configmaps", ns: d.remoteNS},
		// Distributed Istio policy is read, never written.
		{allow: true, verb: "list", group: "security.istio.io", resource: "peerauthentications"},
		{allow: false, verb: "create", group: "security.istio.io", resource: "peerauthentications", ns: d.rootNS},
		{allow: false, verb: "update", group: "networking.istio.io", resource: "virtualservices", ns: "default", name: "anything"},
		// Members' objects are read-only.
		{allow: false, verb: "update", resource: "nodes", name: "anything"},
		{allow: false, verb: "update", resource: "services", ns: "default", name: "kubernetes"},
		{allow: false, verb: "create", group: "discovery.k8s.io", resource: "endpointslices", ns: "default"},
		// Pods: listed (metadata of the mesh's pods, clusters/meshpods.go),
		// never read one by one, never written.
		{allow: true, verb: "list", resource: "pods"},
		{allow: false, verb: "get", resource: "pods", ns: d.ns},
		{allow: false, verb: "create", resource: "pods", ns: d.ns},
		{allow: false, verb: "delete", resource: "pods", ns: d.ns},
		// Services: written only in istio-system (other networks' gateways for
		// the home cluster's istiod, clusters/gatewayexport.go).
		{allow: true, verb: "create", resource: "services", ns: "istio-system"},
		{allow: false, verb: "create", resource: "services", ns: d.ns},
		{allow: false, verb: "create", resource: "services", ns: "default"},
		// Nothing else.
		{allow: false, verb: "create", resource: "serviceaccounts", subresource: "token", ns: d.ns, name: d.sa},
		{allow: false, verb: "create", resource: "namespaces"},
		{allow: false, verb: "create", group: "rbac.authorization.k8s.io", resource: "clusterroles"},
		{allow: false, verb: "create", group: "rbac.authorization.k8s.io", resource: "rolebindings", ns: d.ns},
		{allow: false, verb: "impersonate", resource: "users", name: "admin"},
	})
}

// hubUnexercised are the grants of the hub's RBAC that TestDeploy cannot
// reach, and why; every other granted verb must show in the audit log.
func hubUnexercised(d deployment) map[string]string {
	own := "Role/" + d.ns + "/" + d.sa
	gateways := "Role/istio-system/" + d.sa + "-gateways"
	const (
		forged  = "Events in the hub's namespace are PersistedViewRejected and ViewKeyInvalid, on forged persisted views only (e2e/persist_forgery_test.go)"
		network = "written only when the home cluster is on a network and another network has an east-west gateway (clusters/gatewayexport.go), which this test does not set up"
	)
	m := map[string]string{
		own + ": update secrets. in " + d.ns:            "hub-trust-state is updated only when the trust roots change (trust/store.go), which they do not in this run",
		own + ": create events. in " + d.ns:             forged,
		own + ": patch events. in " + d.ns:              forged,
		gateways + ": get services. in istio-system":    network,
		gateways + ": create services. in istio-system": network,
		gateways + ": update services. in istio-system": network,
		gateways + ": delete services. in istio-system": network,
	}
	if d.rootNS != d.remoteNS {
		// (With both in one namespace, the Events on remote Secrets are
		// patched there.)
		m["Role/"+d.rootNS+"/"+d.sa+"-events: patch events. in "+d.rootNS] = "client-go's recorder patches an Event that repeats; the one rejection here is recorded once"
	}
	return m
}

// memberUnexercised is hubUnexercised for the member identity.
func memberUnexercised(d deployment) map[string]string {
	name := "hub-remote-member"
	if d.deployDir == "" {
		name += "-canary"
	}
	gateways := "Role/istio-system/" + name + "-gateways"
	const (
		network = "written only when the member is on a network and another network has an east-west gateway (clusters/gatewayexport.go), which this test does not set up"
		exports = "read and written with --export-mode=serviceexport only (clusters/export.go); this run federates every Service"
		sds     = "SDS of the member's own proxies (clusters/secrets.go); none connects in this test (e2e/sdstoken_test.go, e2e/sds_scope_test.go)"
	)
	return map[string]string{
		gateways + ": get services. in istio-system":                                         network,
		gateways + ": create services. in istio-system":                                      network,
		gateways + ": update services. in istio-system":                                      network,
		gateways + ": delete services. in istio-system":                                      network,
		"ClusterRole//" + name + ": get serviceexports.multicluster.x-k8s.io in *":           exports,
		"ClusterRole//" + name + ": list serviceexports.multicluster.x-k8s.io in *":          exports,
		"ClusterRole//" + name + ": watch serviceexports.multicluster.x-k8s.io in *":         exports,
		"ClusterRole//" + name + ": update serviceexports/status.multicluster.x-k8s.io in *": exports,
		"ClusterRole//" + name + ": create tokenreviews.authentication.k8s.io in *":          sds,
		"ClusterRole//" + name + ": create subjectaccessreviews.authorization.k8s.io in *":   sds,
	}
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
// in deploy/ except those applied elsewhere (in members, or examples).
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
	notInBase := []string{"kustomization.yaml", "remote-secret-example.yaml", "remote-member-rbac.yaml", "remote-member-rotation-rbac.yaml",
		"eastwest-proxyless-alpn.yaml",
		"home-sds-rbac.yaml", "istiod-meshconfig-example.yaml"}
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
func leaseHolder(ctx context.Context, cs kubernetes.Interface, ns string) string {
	l, err := cs.CoordinationV1().Leases(ns).Get(ctx, "hub-leader", metav1.GetOptions{})
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
