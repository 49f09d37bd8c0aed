package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/hubmesh/hub/distribute"
	"github.com/hubmesh/hub/internal/localcluster"
)

// The attack of issue 21, item 1: a user whose only right is creating
// ServiceEntries in namespace tenant of the home cluster labels one for
// distribution, claiming a federated host with its own endpoint. The hub
// serves member istiods only what comes from the root namespace and names
// no host it owns: the tenant's object (and a root-namespace object that
// claims a federated host) never reaches a real istiod, each is refused
// with a DistributionRejected Event and a reason in /api/v1/distribution,
// while an allowed object is served. The generated ServiceEntry carries
// the Service's creation time, so no later object wins its host by age.
func TestTenantCannotClaimFederatedHosts(t *testing.T) {
	istiodBin(t)
	e := localcluster.Require(t, env)
	ctx := testContext(t)
	home, west := e.Cluster("primary"), e.Cluster("west")
	suffix := rand.String(5)
	app, tenant, root := "app-"+suffix, "tenant-"+suffix, "root-"+suffix
	hc := client(t, home)
	for _, ns := range []string{app, tenant, root} {
		if err := localcluster.EnsureNamespace(ctx, hc, ns); err != nil {
			t.Fatal(err)
		}
	}
	wc := client(t, west)
	if err := localcluster.EnsureNamespace(ctx, wc, app); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.ApplyService(ctx, wc, app, "echo", "http", 8080, []localcluster.Backend{{IP: "198.18.50.1", Port: 8080}}); err != nil {
		t.Fatal(err)
	}
	echo, err := wc.CoreV1().Services(app).Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hubNS := hubNamespace(t, home)
	if _, err := hc.CoreV1().Secrets(hubNS).Create(ctx, localcluster.RemoteSecret(hubNS, "members", map[string][]byte{
		west.Name: west.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	installIstioCRDs(t, home)
	h := startHub(t, home, "--namespace", hubNS, "--root-namespace", root, "--trust-domain", "attack.test")
	eventually(t, time.Minute, func() error {
		if cl := h.clusters(t); cl[west.Name].State != "Ready" {
			return fmt.Errorf("members: %+v", cl)
		}
		return nil
	})

	// The tenant: a ServiceAccount that may create ServiceEntries in its
	// namespace and nothing else.
	tenantDyn, tenantToken := tenantClient(t, home, tenant)
	federatedHost := "echo." + app + ".svc.clusterset.local"
	serviceEntry := func(ns, name string, hosts ...string) *unstructured.Unstructured {
		h := make([]any, len(hosts))
		for i, x := range hosts {
			h[i] = x
		}
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
			"metadata": map[string]any{"name": name, "namespace": ns, "labels": map[string]any{distribute.Label: "true"}},
			"spec": map[string]any{"hosts": h, "exportTo": []any{"*"}, "location": "MESH_INTERNAL", "resolution": "STATIC",
				"ports":     []any{map[string]any{"number": int64(8080), "name": "http", "protocol": "HTTP"}},
				"endpoints": []any{map[string]any{"address": "10.66.6.7"}}},
		}}
	}
	seGVR := schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "serviceentries"}
	if _, err := tenantDyn.Resource(seGVR).Namespace(tenant).Create(ctx, serviceEntry(tenant, "steal", federatedHost), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the tenant creating its ServiceEntry: %v", err)
	}
	if _, err := tenantDyn.Resource(seGVR).Namespace(tenant).Create(ctx, serviceEntry(tenant, "own", "tenant-api.example.com"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the tenant creating its ServiceEntry: %v", err)
	}
	adminDyn, err := dynamic.NewForConfig(home.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	// Even the root namespace may not define a federated host, in either
	// of its names.
	external := serviceEntry(root, "external", "api.example.com") // allowed: created last, a barrier below
	external.Object["spec"].(map[string]any)["endpoints"] = []any{map[string]any{"address": "192.0.2.10"}}
	for _, o := range []*unstructured.Unstructured{
		serviceEntry(root, "shadow", federatedHost),
		serviceEntry(root, "shadow-local", "echo."+app+".svc.cluster.local"),
		serviceEntry(root, "wildcard", "*.local"), // matches every federated host
		external,
	} {
		if _, err := adminDyn.Resource(seGVR).Namespace(root).Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	p := startIstiod(t, west, istiodOptions{ConfigSources: []istiodConfigSource{{Address: "k8s://"}, {Address: "xds://" + h.xdsAddr}}})
	p.waitConfig(t, 2*time.Minute, "ServiceEntry/"+root+"/external", false)
	generated := p.waitConfig(t, 2*time.Minute, "ServiceEntry/"+app+"/hub-echo", false)
	list, err := p.configz()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list {
		if c.Kind != "ServiceEntry" {
			continue
		}
		switch c.Metadata.Namespace {
		case tenant:
			t.Errorf("istiod holds the tenant's %s", c.Key())
		case root:
			if c.Metadata.Name != "external" {
				t.Errorf("istiod holds %s, which claims a federated host", c.Key())
			}
		}
		if strings.Contains(string(c.Spec), "10.66.6.7") {
			t.Errorf("istiod holds %s with the attacker's endpoint: %s", c.Key(), c.Spec)
		}
	}
	if got, want := generated.Metadata.CreationTimestamp, echo.CreationTimestamp.UTC().Format(time.RFC3339); !sameInstant(got, want) {
		t.Errorf("the generated ServiceEntry's creation time %s; want the Service's %s", got, want)
	}

	// Each refusal has its reason in the API and an Event on the object.
	wantRefused := map[string]string{
		tenant + "/steal": distribute.ReasonNamespace, tenant + "/own": distribute.ReasonNamespace,
		root + "/shadow": distribute.ReasonHost, root + "/shadow-local": distribute.ReasonHost,
		root + "/wildcard": distribute.ReasonHost,
	}
	eventually(t, time.Minute, func() error {
		var st distribute.Status
		h.getJSON(t, "/api/v1/distribution", &st)
		got := map[string]string{}
		for _, k := range st.Kinds {
			for _, r := range k.Rejected {
				if _, ok := wantRefused[r.Object]; ok {
					got[r.Object] = r.Reason
				}
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(wantRefused) {
			return fmt.Errorf("refused %v; want %v", got, wantRefused)
		}
		return nil
	})
	for obj := range wantRefused {
		ns, name, _ := strings.Cut(obj, "/")
		eventually(t, time.Minute, func() error {
			evs, err := hc.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
			if err != nil {
				return err
			}
			if !slices.ContainsFunc(evs.Items, func(e corev1.Event) bool {
				return e.Reason == distribute.RejectedReason && e.Type == corev1.EventTypeWarning
			}) {
				return fmt.Errorf("no %s Event on %s", distribute.RejectedReason, obj)
			}
			return nil
		})
	}

	// The refusals' new paths (log, API, dashboard) carry no credentials.
	logData, err := os.ReadFile(h.logPath)
	if err != nil {
		t.Fatal(err)
	}
	where := dashboardPages(t, h.adminURL, home.AdminToken(), "/distribution")
	var status json.RawMessage
	h.getJSON(t, "/api/v1/distribution", &status)
	where["GET /api/v1/distribution"] = string(status)
	for name, text := range where {
		requireNoSecrets(t, name, text, home, west)
		if !strings.Contains(text, "HostNotAllowed") {
			t.Errorf("%s does not show the refusals' reason", name)
		}
	}
	if strings.Contains(string(logData), tenantToken) || strings.Contains(string(logData), home.AdminToken()) {
		t.Error("the hub log contains a token")
	}
}

// tenantClient is a dynamic client of a ServiceAccount in namespace ns of
// c whose only right is creating and reading ServiceEntries there, and
// its token.
func tenantClient(t *testing.T, c *localcluster.Cluster, ns string) (dynamic.Interface, string) {
	t.Helper()
	ctx := testContext(t)
	cs := client(t, c)
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "serviceentries"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"networking.istio.io"}, Resources: []string{"serviceentries"}, Verbs: []string{"create", "get", "list"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "tenant"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "serviceentries"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "tenant", Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	exp := int64(3600)
	tok, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "tenant", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(c.RESTConfig())
	cfg.BearerToken = tok.Status.Token
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return dc, tok.Status.Token
}

// sameInstant compares two RFC 3339 times.
func sameInstant(a, b string) bool {
	ta, err1 := time.Parse(time.RFC3339, a)
	tb, err2 := time.Parse(time.RFC3339, b)
	return err1 == nil && err2 == nil && ta.Equal(tb)
}
