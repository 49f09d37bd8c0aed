package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/rand"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/internal/localcluster"
)

// The identity deploy/remote-member-rbac.yaml binds.
const registerSA = "system:serviceaccount:istio-system:istio-reader-service-account"

// TestRegisterAndRotate registers a real member with `hub register` and
// rotates its credential: the hub makes it Ready with a token that expires
// when asked and may do exactly what deploy/remote-member-rbac.yaml grants
// (the objects in the member are that file's); --rotate keeps the member
// Ready throughout (every state change of the member is in the hub's log,
// and the API is polled meanwhile), the new token works and the old one is
// rejected by the member's API server afterwards.
func TestRegisterAndRotate(t *testing.T) {
	e := localcluster.Require(t, env)
	ctx := testContext(t)
	home, west := e.Cluster("primary"), e.Cluster("west")
	homeClient, westClient := client(t, home), client(t, west)
	ns := "e2e-reg-" + rand.String(6)
	if err := localcluster.EnsureNamespace(ctx, homeClient, ns); err != nil {
		t.Fatal(err)
	}
	id := "reg-" + rand.String(5)
	t.Cleanup(func() { cleanupRegistration(t, westClient, id) })

	dir := t.TempDir()
	memberKC, homeKC, tokenFile := filepath.Join(dir, "member.yaml"), filepath.Join(dir, "home.yaml"), filepath.Join(dir, "hub-token")
	for path, data := range map[string][]byte{memberKC: west.Kubeconfig(), homeKC: home.Kubeconfig()} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	h := startHub(t, home, "--namespace", ns)
	if err := os.WriteFile(tokenFile, []byte(h.token), 0o600); err != nil {
		t.Fatal(err)
	}
	common := []string{"--kubeconfig", memberKC, "--context", west.Name, "--cluster-id", id,
		"--hub-kubeconfig", homeKC, "--namespace", ns, "--hub-url", h.adminURL, "--hub-token-file", tokenFile}

	// A hub URL whose token the hub refuses stops it before anything is made.
	badToken := filepath.Join(dir, "bad-token")
	if err := os.WriteFile(badToken, []byte("not-a-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := runHubRegister(ctx, append(slices.Clone(common), "--hub-token-file", badToken)...); err == nil || !strings.Contains(out, "the hub's API: hub answered 401 Unauthorized") {
		t.Errorf("registering with a token the hub refuses: %v\n%s", err, out)
	}
	if gens, err := westClient.CoreV1().Secrets("istio-system").List(ctx, metav1.ListOptions{LabelSelector: "hub.federation/member-token-for=" + id}); err != nil || len(gens.Items) != 0 {
		t.Errorf("a refused registration left %v credential generations (%v)", len(gens.Items), err)
	}

	// 1. Register.
	start := time.Now()
	out, err := runHubRegister(ctx, append(common, "--token-ttl", "1h", "--network", "net-reg")...)
	if err != nil {
		t.Fatalf("hub register: %v\n%s", err, out)
	}
	t.Logf("hub register took %s:\n%s", time.Since(start).Round(time.Millisecond), out)
	secret, err := homeClient.CoreV1().Secrets(ns).Get(ctx, "istio-remote-secret-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if secret.Labels["istio/multiCluster"] != "true" || secret.Annotations["hub.federation/network"] != id+"=net-reg" {
		t.Errorf("remote secret metadata %+v", secret.ObjectMeta)
	}
	kubeconfig1 := secret.Data[id]
	token1 := tokenOf(t, kubeconfig1)
	if strings.Contains(out, token1) {
		t.Fatal("hub register printed the token")
	}
	c := h.clusters(t)[id]
	if c.State != "Ready" || c.KubeconfigSHA256 != sha256Hex(kubeconfig1) {
		t.Fatalf("after hub register the hub reports %+v; want Ready with the written kubeconfig %s", c, sha256Hex(kubeconfig1))
	}

	// The token is short-lived: it expires in the hour asked for.
	iat, exp := tokenTimes(t, token1)
	if exp.Sub(iat) != time.Hour || time.Until(exp) > time.Hour {
		t.Errorf("token issued %s expires %s; want one hour", iat, exp)
	}

	// The objects in the member are deploy/remote-member-rbac.yaml's, and
	// nothing else binds the identity.
	checkMemberRBACIsTheFile(ctx, t, westClient)
	// The token may do what the file grants and nothing else.
	tokenClient := memberTokenClient(t, west, token1)
	if _, err := tokenClient.CoreV1().Services("").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		t.Errorf("the member's token cannot list Services: %v", err)
	}
	if _, err := tokenClient.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing ConfigMaps with the member's token: %v; want Forbidden", err)
	}
	if _, err := tokenClient.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 1}}},
	}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("creating a Service outside istio-system with the member's token: %v; want Forbidden", err)
	}
	for _, ra := range []authorizationv1.ResourceAttributes{
		{Verb: "get", Resource: "configmaps", Namespace: "kube-system"},
		{Verb: "update", Resource: "secrets", Namespace: "istio-system"},
		{Verb: "get", Resource: "namespaces", Name: "kube-system"},
		{Verb: "create", Resource: "pods", Namespace: "default"},
		{Verb: "create", Resource: "services", Namespace: "default"},
		{Verb: "impersonate", Resource: "users"},
		{Verb: "create", Resource: "serviceaccounts/token", Namespace: "istio-system", Name: "istio-reader-service-account"},
		{Verb: "delete", Resource: "secrets", Namespace: "istio-system"},
	} {
		if allowed(ctx, t, westClient, ra) {
			t.Errorf("the member's identity may %s %s %s/%s: more than deploy/remote-member-rbac.yaml grants", ra.Verb, ra.Resource, ra.Namespace, ra.Name)
		}
	}

	// Registering an ID that is registered is refused.
	if out, err := runHubRegister(ctx, common...); err == nil || !strings.Contains(out, "is already registered by secret "+ns+"/istio-remote-secret-"+id+": rotate its credential with --rotate") {
		t.Errorf("registering %s again: %v\n%s", id, err, out)
	}

	// 2. Rotate, polling the API throughout.
	changesBefore := memberStateChanges(t, h.logPath, id)
	poll := pollMember(h, id)
	start = time.Now()
	out, err = runHubRegister(ctx, append(common, "--rotate", "--token-ttl", "2h")...)
	rotated := time.Now()
	states, polls := poll.stop()
	if err != nil {
		t.Fatalf("hub register --rotate: %v\n%s", err, out)
	}
	t.Logf("hub register --rotate took %s:\n%s", rotated.Sub(start).Round(time.Millisecond), out)
	if polls < 5 {
		t.Errorf("only %d polls of the API during rotation", polls)
	}
	for state, n := range states {
		if state != "Ready" {
			t.Errorf("the API reported %s %s %d times during rotation; want Ready throughout (%v)", id, state, n, states)
		}
	}
	// Every state change of the member's active client is logged. The swap
	// logs the new client's Syncing → Ready as the member's (it becomes the
	// member's before it publishes); a change to anything but Ready would be
	// the member leaving Ready.
	for _, change := range memberStateChanges(t, h.logPath, id)[len(changesBefore):] {
		if !strings.HasSuffix(change, "→Ready") {
			t.Errorf("the member's state changed during rotation: %s", change)
		}
	}
	t.Logf("rotation: %d API polls, states %v", polls, states)
	secret, err = homeClient.CoreV1().Secrets(ns).Get(ctx, "istio-remote-secret-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig2 := secret.Data[id]
	token2 := tokenOf(t, kubeconfig2)
	if token2 == token1 || strings.Contains(out, token2) || strings.Contains(out, token1) {
		t.Fatal("the token did not change, or hub register printed one")
	}
	if c := h.clusters(t)[id]; c.State != "Ready" || c.KubeconfigSHA256 != sha256Hex(kubeconfig2) {
		t.Errorf("after rotation the hub reports %+v; want Ready with the new kubeconfig", c)
	}
	if iat, exp := tokenTimes(t, token2); exp.Sub(iat) != 2*time.Hour {
		t.Errorf("rotated token issued %s expires %s; want two hours", iat, exp)
	}
	if _, err := memberTokenClient(t, west, token2).CoreV1().Services("").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		t.Errorf("the new token does not work: %v", err)
	}
	gens, err := westClient.CoreV1().Secrets("istio-system").List(ctx, metav1.ListOptions{LabelSelector: "hub.federation/member-token-for=" + id})
	if err != nil {
		t.Fatal(err)
	}
	if len(gens.Items) != 1 || gens.Items[0].Labels["hub.federation/generation"] != "2" {
		t.Errorf("credential generations in the member after rotation: %d, want generation 2 alone", len(gens.Items))
	}
	// The old token is revoked (its bound Secret is gone); the member's API
	// server caches a token's authentication for up to 10 s.
	eventually(t, 30*time.Second, func() error {
		_, err := tokenClient.CoreV1().Services("").List(ctx, metav1.ListOptions{Limit: 1})
		if !apierrors.IsUnauthorized(err) {
			return fmt.Errorf("the old token still gets %v; want Unauthorized", err)
		}
		return nil
	})
	t.Logf("old token rejected %s after hub register --rotate returned", time.Since(rotated).Round(time.Millisecond))
	if c := h.clusters(t)[id]; c.State != "Ready" {
		t.Errorf("after the old token was revoked the hub reports %+v", c)
	}

	// 3. A rotation the hub cannot take (the new kubeconfig names a server
	// it cannot reach) is undone: the current credential is written back
	// and stays valid, the new generation is deleted.
	out, err = runHubRegister(ctx, append(common, "--rotate", "--server", "https://127.0.0.1:1", "--wait", "5s")...)
	if err == nil || !strings.Contains(out, "rotation not taken by the hub, the previous credential is written back and stays") {
		t.Fatalf("rotating to an unreachable server: %v\n%s", err, out)
	}
	t.Logf("a rotation the hub did not take:\n%s", out)
	secret, err = homeClient.CoreV1().Secrets(ns).Get(ctx, "istio-remote-secret-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(secret.Data[id], kubeconfig2) {
		t.Error("the remote Secret does not hold the previous kubeconfig again")
	}
	gens, err = westClient.CoreV1().Secrets("istio-system").List(ctx, metav1.ListOptions{LabelSelector: "hub.federation/member-token-for=" + id})
	if err != nil {
		t.Fatal(err)
	}
	if len(gens.Items) != 1 || gens.Items[0].Labels["hub.federation/generation"] != "2" {
		t.Errorf("credential generations after an undone rotation: %d, want generation 2 alone", len(gens.Items))
	}
	if _, err := memberTokenClient(t, west, token2).CoreV1().Services("").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		t.Errorf("the current token stopped working: %v", err)
	}
	eventually(t, 30*time.Second, func() error {
		if c := h.clusters(t)[id]; c.State != "Ready" || c.KubeconfigSHA256 != sha256Hex(kubeconfig2) {
			return fmt.Errorf("the hub reports %+v; want Ready with the previous kubeconfig", c)
		}
		return nil
	})

	// 4. -o yaml --show-token prints the remote Secret (nothing written in
	// the home cluster) with a working token.
	printed := id + "-printed"
	t.Cleanup(func() { cleanupRegistration(t, westClient, printed) })
	cmd := exec.CommandContext(ctx, hubBin, "register", "--kubeconfig", memberKC, "--context", west.Name, "--cluster-id", printed,
		"--namespace", ns, "-o", "yaml", "--show-token")
	cmd.Env = append(os.Environ(), "KUBECONFIG=/nonexistent")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("hub register -o yaml: %v\n%s", err, stderr.String())
	}
	var ps corev1.Secret
	if err := yaml.UnmarshalStrict(stdout.Bytes(), &ps); err != nil {
		t.Fatalf("-o yaml printed %v", err)
	}
	if ps.Name != "istio-remote-secret-"+printed || ps.Labels["istio/multiCluster"] != "true" {
		t.Errorf("printed secret %+v", ps.ObjectMeta)
	}
	printedToken := tokenOf(t, []byte(ps.StringData[printed]))
	if strings.Contains(stderr.String(), printedToken) {
		t.Error("hub register -o yaml printed the token on stderr")
	}
	if _, err := memberTokenClient(t, west, printedToken).CoreV1().Services("").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		t.Errorf("the printed token does not work: %v", err)
	}
	if _, err := homeClient.CoreV1().Secrets(ns).Get(ctx, ps.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("-o yaml wrote the remote Secret into the home cluster (%v)", err)
	}
}

// runHubRegister runs `hub register` with args, with no KUBECONFIG of
// the environment, and returns its stdout and stderr together.
func runHubRegister(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, hubBin, append([]string{"register"}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG=/nonexistent")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func tokenOf(t *testing.T, kubeconfig []byte) string {
	t.Helper()
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	user := cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo]
	if user == nil || user.Token == "" || user.Exec != nil || user.TokenFile != "" {
		t.Fatal("the remote Secret's kubeconfig has no inline token")
	}
	return user.Token
}

// tokenTimes reads a JWT's iat and exp (not verified: the member's API
// server does that).
func tokenTimes(t *testing.T, token string) (iat, exp time.Time) {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatal("the token is not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims struct{ Iat, Exp int64 }
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	return time.Unix(claims.Iat, 0), time.Unix(claims.Exp, 0)
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func memberTokenClient(t *testing.T, c *localcluster.Cluster, token string) kubernetes.Interface {
	t.Helper()
	cfg := rest.AnonymousClientConfig(c.RESTConfig())
	cfg.BearerToken = token
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func allowed(ctx context.Context, t *testing.T, admin kubernetes.Interface, ra authorizationv1.ResourceAttributes) bool {
	t.Helper()
	sar, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: registerSA, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:istio-system", "system:authenticated"},
		ResourceAttributes: &ra,
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return sar.Status.Allowed
}

// checkMemberRBACIsTheFile compares the RBAC objects in the member with
// deploy/remote-member-rbac.yaml as read here, and checks that no other
// binding names the identity: what `hub register` grants cannot drift
// from the file.
func checkMemberRBACIsTheFile(ctx context.Context, t *testing.T, c kubernetes.Interface) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "deploy", "remote-member-rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{} // bindings of the file, kind/namespace/name
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			if runtime.IsMissingKind(err) {
				continue // a document of comments
			}
			t.Fatal(err)
		}
		rbac := c.RbacV1()
		var got, wantFields, gotFields any
		switch o := obj.(type) {
		case *rbacv1.ClusterRole:
			live, err := rbac.ClusterRoles().Get(ctx, o.Name, metav1.GetOptions{})
			got, wantFields, gotFields = live, []any{o.Rules, o.AggregationRule, o.Labels}, fieldsOf(err, func() any { return []any{live.Rules, live.AggregationRule, live.Labels} })
		case *rbacv1.Role:
			live, err := rbac.Roles(o.Namespace).Get(ctx, o.Name, metav1.GetOptions{})
			got, wantFields, gotFields = live, []any{o.Rules, o.Labels}, fieldsOf(err, func() any { return []any{live.Rules, live.Labels} })
		case *rbacv1.RoleBinding:
			want["RoleBinding/"+o.Namespace+"/"+o.Name] = true
			live, err := rbac.RoleBindings(o.Namespace).Get(ctx, o.Name, metav1.GetOptions{})
			got, wantFields, gotFields = live, []any{o.RoleRef, o.Subjects, o.Labels}, fieldsOf(err, func() any { return []any{live.RoleRef, live.Subjects, live.Labels} })
		case *rbacv1.ClusterRoleBinding:
			want["ClusterRoleBinding//"+o.Name] = true
			live, err := rbac.ClusterRoleBindings().Get(ctx, o.Name, metav1.GetOptions{})
			got, wantFields, gotFields = live, []any{o.RoleRef, o.Subjects, o.Labels}, fieldsOf(err, func() any { return []any{live.RoleRef, live.Subjects, live.Labels} })
		default:
			t.Fatalf("unexpected %T in remote-member-rbac.yaml", obj)
		}
		if !equality.Semantic.DeepEqual(wantFields, gotFields) {
			t.Errorf("%T in the member differs from remote-member-rbac.yaml:\n got %+v\nwant %+v", got, gotFields, wantFields)
		}
	}
	bound := map[string]bool{}
	crbs, err := c.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range crbs.Items {
		if namesSA(b.Subjects) {
			bound["ClusterRoleBinding//"+b.Name] = true
		}
	}
	rbs, err := c.RbacV1().RoleBindings("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range rbs.Items {
		if namesSA(b.Subjects) {
			bound["RoleBinding/"+b.Namespace+"/"+b.Name] = true
		}
	}
	if !equality.Semantic.DeepEqual(bound, want) {
		t.Errorf("bindings of %s in the member: %v; want the file's %v", registerSA, bound, want)
	}
}

// fieldsOf is get() unless err (then err itself, which equals nothing).
func fieldsOf(err error, get func() any) any {
	if err != nil {
		return err.Error()
	}
	return get()
}

func namesSA(subjects []rbacv1.Subject) bool {
	for _, s := range subjects {
		if s.Kind == rbacv1.ServiceAccountKind && "system:serviceaccount:"+s.Namespace+":"+s.Name == registerSA {
			return true
		}
	}
	return false
}

// memberStateChanges lists the member's state changes the hub logged for
// its active client (a new kubeconfig's candidate logs with a prefix).
func memberStateChanges(t *testing.T, logPath, id string) []string {
	t.Helper()
	data, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		var entry struct {
			Msg, Cluster, From, To string
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "cluster state changed" && entry.Cluster == id {
			out = append(out, entry.From+"→"+entry.To)
		}
	}
	return out
}

// memberPoller reads a member's state from the API until stopped.
type memberPoller struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	states map[string]int
	polls  int
}

func pollMember(h *hubProcess, id string) *memberPoller {
	ctx, cancel := context.WithCancel(context.Background())
	p := &memberPoller{cancel: cancel, done: make(chan struct{}), states: map[string]int{}}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			state := memberState(ctx, h, id)
			if ctx.Err() != nil {
				return
			}
			p.mu.Lock()
			p.states[state]++
			p.polls++
			p.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

func (p *memberPoller) stop() (map[string]int, int) {
	p.cancel()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.states, p.polls
}

// memberState is the member's state from the API, or what went wrong.
func memberState(ctx context.Context, h *hubProcess, id string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.adminURL+"/api/v1/clusters/"+id, nil)
	if err != nil {
		return err.Error()
	}
	req.Header.Set("Authorization", "Bearer "+h.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "error: " + err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "HTTP " + resp.Status
	}
	var c api.Cluster
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		return "decoding: " + err.Error()
	}
	return c.State
}

// cleanupRegistration deletes the credential generations `hub register`
// made in the member for id (the member RBAC stays: it is the same for
// every registration, and TestDeploy applies it too).
func cleanupRegistration(t *testing.T, c kubernetes.Interface, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.CoreV1().Secrets("istio-system").DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: "hub.federation/member-token-for=" + id}); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}
