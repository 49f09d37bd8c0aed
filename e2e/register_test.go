package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/rand"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/deploy"
	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/tcpproxy"
)

// The identity deploy/remote-member-rbac.yaml binds.
const registerSA = "system:serviceaccount:istio-system:hub-member-reader"

// TestRegisterAndRotate registers a real member with `hub register` and
// rotates its credential, through a round-robin balancer over two hub
// replicas (as the chart's Service spreads new connections over its two):
// the hub makes it Ready with a token that expires when asked and may do
// exactly what deploy/remote-member-rbac.yaml grants (the objects in the
// member are that file's); --rotate keeps the member Ready throughout on
// both replicas (every state change of the member is in their logs, and
// the API is polled meanwhile), revokes the old token only once every
// replica runs the new one (replica B's watch of the home cluster is held
// during the rotation: it switches late), and the new token works while
// the old one is rejected by the member's API server afterwards. A
// rotation a replica does not take within --wait is undone, the new token
// revoked only once every replica runs the previous kubeconfig again. A
// second hub's registration of the same member (another remote Secrets
// namespace) has a credential lineage of its own that rotations of the
// first leave alone.
func TestRegisterAndRotate(t *testing.T) {
	e := localcluster.Require(t, env)
	ctx := testContext(t)
	home, west := e.Cluster("primary"), e.Cluster("west")
	homeClient, westClient := client(t, home), client(t, west)
	ns, ns2 := "e2e-reg-"+rand.String(6), "e2e-reg2-"+rand.String(6)
	for _, n := range []string{ns, ns2} {
		if err := localcluster.EnsureNamespace(ctx, homeClient, n); err != nil {
			t.Fatal(err)
		}
	}
	id := "reg-" + rand.String(5)
	t.Cleanup(func() { cleanupRegistration(t, westClient, id) })

	f := writeRegisterFiles(t, home, west)
	memberKC, homeKC, tokenFile, apiTokens := f.memberKC, f.homeKC, f.tokenFile, f.apiTokens
	dir := t.TempDir()
	heldKC := filepath.Join(dir, "home-held.yaml")
	held := startHeldProxy(t, strings.TrimPrefix(home.Server(), "https://"))
	heldCfg, err := clientcmd.Load(home.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	heldCfg.Clusters[home.Name].Server = "https://" + held.addr
	heldData, err := clientcmd.Write(*heldCfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(heldKC, heldData, 0o600); err != nil {
		t.Fatal(err)
	}
	a := startHub(t, home, "--namespace", ns, "--api-token-file", apiTokens)
	eventually(t, 30*time.Second, func() error { // A leads: holding B's home cluster must not move the Lease
		if holder := hubLeaseHolder(t, home, ns); !strings.HasSuffix(holder, "-"+a.pid()) {
			return fmt.Errorf("lease holder %q, want replica A (pid %s)", holder, a.pid())
		}
		return nil
	})
	b := startHub(t, home, "--namespace", ns, "--api-token-file", apiTokens, "--kubeconfig", heldKC)
	lb := startRoundRobin(t, a.addrs["admin"], b.addrs["admin"])
	replicas := map[string]*hubProcess{"A": a, "B": b}
	common := []string{"--kubeconfig", memberKC, "--context", west.Name, "--cluster-id", id,
		"--hub-kubeconfig", homeKC, "--namespace", ns, "--hub-url", lb.url, "--hub-token-file", tokenFile}

	// A hub URL whose token the hub refuses stops it before anything is
	// made, and so does the home cluster's own ID.
	badToken := filepath.Join(dir, "bad-token")
	if err := os.WriteFile(badToken, []byte("not-a-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := runHubRegister(ctx, append(slices.Clone(common), "--hub-token-file", badToken)...); err == nil || !strings.Contains(out, "the hub's API: hub answered 401 Unauthorized") {
		t.Errorf("registering with a token the hub refuses: %v\n%s", err, out)
	}
	if out, err := runHubRegister(ctx, append(slices.Clone(common), "--cluster-id", home.Name)...); err == nil || !strings.Contains(out, "cluster ID "+home.Name+" is the hub's home cluster (hub serve --cluster-id)") {
		t.Errorf("registering the home cluster's ID: %v\n%s", err, out)
	}
	for _, refused := range []string{id, home.Name} {
		if gens := generations(ctx, t, westClient, refused); len(gens) != 0 {
			t.Errorf("a refused registration left credential generations of %s: %v", refused, gens)
		}
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
	for name, h := range replicas {
		eventually(t, 30*time.Second, func() error {
			if c := h.clusters(t)[id]; c.State != "Ready" || c.KubeconfigSHA256 != sha256Hex(kubeconfig1) {
				return fmt.Errorf("replica %s reports %+v; want Ready with the written kubeconfig %s", name, c, sha256Hex(kubeconfig1))
			}
			return nil
		})
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
	checkMemberWritesOnlyHubGateways(ctx, t, westClient, tokenClient)
	for _, ra := range []authorizationv1.ResourceAttributes{
		{Verb: "get", Resource: "configmaps", Namespace: "kube-system"},
		{Verb: "update", Resource: "secrets", Namespace: "istio-system"},
		{Verb: "get", Resource: "namespaces", Name: "kube-system"},
		{Verb: "create", Resource: "pods", Namespace: "default"},
		{Verb: "create", Resource: "services", Namespace: "default"},
		{Verb: "impersonate", Resource: "users"},
		{Verb: "create", Resource: "serviceaccounts/token", Namespace: "istio-system", Name: "hub-member-reader"},
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
	// A second hub (its remote Secrets in ns2) registers the same member
	// under the same ID: a lineage of its own.
	if out, err := runHubRegister(ctx, "--kubeconfig", memberKC, "--context", west.Name, "--cluster-id", id, "--hub-kubeconfig", homeKC, "--namespace", ns2); err != nil {
		t.Fatalf("registering %s for a second hub: %v\n%s", id, err, out)
	}
	secret2, err := homeClient.CoreV1().Secrets(ns2).Get(ctx, "istio-remote-secret-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	otherHubToken := tokenOf(t, secret2.Data[id])
	gens := generations(ctx, t, westClient, id)
	if len(gens) != 2 || gens[0].gen != 1 || gens[1].gen != 1 || gens[0].lineage == gens[1].lineage {
		t.Fatalf("generations after registering for two hubs: %v; want generation 1 of two lineages", gens)
	}
	lineage := lineageOf(t, westClient, token1)

	// 2. Rotate, polling the API of both replicas throughout; replica B's
	// watch of the home cluster is held, so it runs the previous
	// kubeconfig until it is let go: the old token must outlive that.
	changesBefore := map[string]int{}
	polls := map[string]*memberPoller{}
	for name, h := range replicas {
		changesBefore[name] = len(memberStateChanges(t, h.logPath, id))
		polls[name] = pollMember(h, id)
	}
	held.hold()
	start = time.Now()
	rotation := startHubRegister(ctx, append(common, "--rotate", "--token-ttl", "2h", "--settle", "3s")...)
	var kubeconfig2 []byte
	eventually(t, 60*time.Second, func() error { // A switches
		if rotation.exited() {
			return nil
		}
		s, err := homeClient.CoreV1().Secrets(ns).Get(ctx, "istio-remote-secret-"+id, metav1.GetOptions{})
		if err != nil || bytes.Equal(s.Data[id], kubeconfig1) {
			return fmt.Errorf("the new kubeconfig is not written yet (%v)", err)
		}
		kubeconfig2 = s.Data[id]
		if c := a.clusters(t)[id]; c.KubeconfigSHA256 != sha256Hex(kubeconfig2) {
			return fmt.Errorf("replica A reports %+v, not yet the new kubeconfig", c)
		}
		return nil
	})
	askedB := lb.count(1)
	eventually(t, 30*time.Second, func() error { // B is asked, and still runs the previous kubeconfig
		if rotation.exited() {
			return nil
		}
		if n := lb.count(1) - askedB; n < 2 {
			return fmt.Errorf("replica B asked %d times since A switched", n)
		}
		return nil
	})
	if rotation.exited() {
		out, err := rotation.wait()
		if err != nil {
			t.Fatalf("hub register --rotate: %v\n%s", err, out)
		}
		t.Fatalf("hub register --rotate returned while replica B still ran the previous kubeconfig (its home cluster held): the old token is revoked under B's client\n%s", out)
	}
	if c := b.clusters(t)[id]; c.State != "Ready" || c.KubeconfigSHA256 != sha256Hex(kubeconfig1) {
		t.Fatalf("replica B, its home cluster held, reports %+v; want Ready with the previous kubeconfig", c)
	}
	held.release()
	out, err = rotation.wait()
	rotated := time.Now()
	if err != nil {
		t.Fatalf("hub register --rotate: %v\n%s", err, out)
	}
	if c := b.clusters(t)[id]; c.State != "Ready" || c.KubeconfigSHA256 != sha256Hex(kubeconfig2) {
		t.Errorf("hub register --rotate returned while replica B reports %+v; want Ready with the new kubeconfig", c)
	}
	t.Logf("hub register --rotate took %s (replica B held for part of it):\n%s", rotated.Sub(start).Round(time.Millisecond), out)
	for name, h := range replicas {
		states, _, n := polls[name].stop()
		if n < 5 {
			t.Errorf("only %d polls of replica %s's API during rotation", n, name)
		}
		for state, k := range states {
			if state != "Ready" {
				t.Errorf("replica %s reported %s %s %d times during rotation; want Ready throughout (%v)", name, id, state, k, states)
			}
		}
		// Every state change of the member's active client is logged. The
		// swap logs the new client's Syncing → Ready as the member's (it
		// becomes the member's before it publishes); a change to anything
		// but Ready would be the member leaving Ready.
		for _, change := range memberStateChanges(t, h.logPath, id)[changesBefore[name]:] {
			if !strings.HasSuffix(change, "→Ready") {
				t.Errorf("the member's state changed on replica %s during rotation: %s", name, change)
			}
		}
		t.Logf("rotation: %d polls of replica %s, states %v", n, name, states)
	}
	token2 := tokenOf(t, kubeconfig2)
	if token2 == token1 || strings.Contains(out, token2) || strings.Contains(out, token1) {
		t.Fatal("the token did not change, or hub register printed one")
	}
	if c := a.clusters(t)[id]; c.State != "Ready" || c.KubeconfigSHA256 != sha256Hex(kubeconfig2) {
		t.Errorf("after rotation replica A reports %+v; want Ready with the new kubeconfig", c)
	}
	if iat, exp := tokenTimes(t, token2); exp.Sub(iat) != 2*time.Hour {
		t.Errorf("rotated token issued %s expires %s; want two hours", iat, exp)
	}
	if _, err := memberTokenClient(t, west, token2).CoreV1().Services("").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		t.Errorf("the new token does not work: %v", err)
	}
	wantGens := func(when string, gen int) {
		t.Helper()
		var mine, other []generation
		for _, g := range generations(ctx, t, westClient, id) {
			if g.lineage == lineage {
				mine = append(mine, g)
			} else {
				other = append(other, g)
			}
		}
		if len(mine) != 1 || mine[0].gen != gen || len(other) != 1 || other[0].gen != 1 {
			t.Errorf("credential generations %s: %v of lineage %s and %v of others; want generation %d alone, and the second hub's generation 1", when, mine, lineage, other, gen)
		}
	}
	wantGens("after rotation", 2)
	if lineageOf(t, westClient, token2) != lineage {
		t.Error("the rotation started another lineage")
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
	for name, h := range replicas {
		if c := h.clusters(t)[id]; c.State != "Ready" {
			t.Errorf("after the old token was revoked replica %s reports %+v", name, c)
		}
	}

	// 3. A rotation replica B does not take within --wait (its home
	// cluster held throughout) is undone: the current kubeconfig is
	// written back, and the new generation is deleted only once every
	// replica runs the current one again. Replica A took the new one: at
	// the deletion it must be back on the current one.
	polls["A"] = pollMember(a, id)
	deletedWhileA := watchGenerationDeleted(ctx, t, westClient, lineage, 3, a, id)
	held.hold()
	out, err = runHubRegister(ctx, append(common, "--rotate", "--wait", "10s", "--settle", "2s")...)
	_, hashesA, _ := polls["A"].stop()
	if err == nil || !strings.Contains(out, "rotation not taken by the hub, the previous credential is written back and stays (the new one is revoked)") {
		t.Fatalf("a rotation replica B did not take: %v\n%s", err, out)
	}
	t.Logf("a rotation replica B did not take:\n%s", out)
	if len(hashesA) < 2 {
		t.Errorf("replica A ran %v during the undone rotation: it never took the new kubeconfig, so the undo was not put to the test", hashesA)
	}
	select {
	case sha := <-deletedWhileA:
		if sha != sha256Hex(kubeconfig2) {
			t.Errorf("the new generation was deleted while replica A ran %q, not the restored kubeconfig: its client's token was revoked under it", sha)
		}
	case <-time.After(30 * time.Second):
		t.Error("the new generation of the undone rotation was not deleted")
	}
	held.release()
	secret, err = homeClient.CoreV1().Secrets(ns).Get(ctx, "istio-remote-secret-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(secret.Data[id], kubeconfig2) {
		t.Error("the remote Secret does not hold the previous kubeconfig again")
	}
	wantGens("after an undone rotation", 2)
	if _, err := memberTokenClient(t, west, token2).CoreV1().Services("").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		t.Errorf("the current token stopped working: %v", err)
	}
	for name, h := range replicas {
		eventually(t, 30*time.Second, func() error {
			if c := h.clusters(t)[id]; c.State != "Ready" || c.KubeconfigSHA256 != sha256Hex(kubeconfig2) {
				return fmt.Errorf("replica %s reports %+v; want Ready with the previous kubeconfig", name, c)
			}
			return nil
		})
	}
	// The second hub's token outlived both rotations of the first's.
	if _, err := memberTokenClient(t, west, otherHubToken).CoreV1().Services("").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		t.Errorf("the second hub's token stopped working: %v", err)
	}

	// 3b. A rotation by an identity with only the rotation rights
	// (deploy/remote-member-rotation-rbac.yaml): no RBAC, no admission
	// policy, no other namespace. It succeeds, and the hubs take it.
	rotatorKC := rotatorKubeconfig(ctx, t, west, westClient)
	if out, err := runHubRegister(ctx, append(slices.Clone(common), "--kubeconfig", rotatorKC, "--rotate", "--settle", "2s")...); err != nil {
		t.Fatalf("hub register --rotate with only the rotation rights: %v\n%s", err, out)
	}
	secret, err = homeClient.CoreV1().Secrets(ns).Get(ctx, "istio-remote-secret-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig3 := secret.Data[id]
	for name, h := range replicas {
		eventually(t, 30*time.Second, func() error {
			if c := h.clusters(t)[id]; c.State != "Ready" || c.KubeconfigSHA256 != sha256Hex(kubeconfig3) {
				return fmt.Errorf("replica %s reports %+v; want Ready with the rotator's kubeconfig", name, c)
			}
			return nil
		})
	}
	eventually(t, 30*time.Second, func() error {
		if _, err := memberTokenClient(t, west, token2).CoreV1().Services("").List(ctx, metav1.ListOptions{Limit: 1}); err == nil {
			return errors.New("the token the rotator replaced still works")
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

// generation is one credential generation Secret in the member.
type generation struct {
	lineage string
	gen     int
}

// registerFiles are the files `hub register` and the hubs of its tests
// read: the member's and the home cluster's admin kubeconfigs, the hub
// API token (the home admin token) and the hub's --api-token-file
// granting it write (static tokens: a replica answers even while its home
// cluster is held).
type registerFiles struct{ memberKC, homeKC, tokenFile, apiTokens string }

func writeRegisterFiles(t *testing.T, home, member *localcluster.Cluster) registerFiles {
	t.Helper()
	dir := t.TempDir()
	f := registerFiles{filepath.Join(dir, "member.yaml"), filepath.Join(dir, "home.yaml"), filepath.Join(dir, "hub-token"), filepath.Join(dir, "api-tokens")}
	for path, data := range map[string][]byte{
		f.memberKC: member.Kubeconfig(), f.homeKC: home.Kubeconfig(),
		f.apiTokens: []byte(home.AdminToken() + ",e2e-admin,write\n"), f.tokenFile: []byte(home.AdminToken()),
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// generations lists the credential generations `hub register` minted in
// the member for id, by lineage and number.
func generations(ctx context.Context, t *testing.T, c kubernetes.Interface, id string) []generation {
	t.Helper()
	list, err := c.CoreV1().Secrets("istio-system").List(ctx, metav1.ListOptions{LabelSelector: "hub.federation/member-token-for=" + id})
	if err != nil {
		t.Fatal(err)
	}
	var out []generation
	for _, s := range list.Items {
		n, err := strconv.Atoi(s.Labels["hub.federation/generation"])
		l := s.Labels["hub.federation/member-token-lineage"]
		if err != nil || s.Name != fmt.Sprintf("hub-member-token-%s-%d", l, n) {
			t.Errorf("generation Secret %s labelled %v", s.Name, s.Labels)
		}
		out = append(out, generation{l, n})
	}
	slices.SortFunc(out, func(a, b generation) int { return cmp.Or(strings.Compare(a.lineage, b.lineage), a.gen-b.gen) })
	return out
}

// lineageOf is the lineage of the generation Secret a token is bound to.
func lineageOf(t *testing.T, c kubernetes.Interface, token string) string {
	t.Helper()
	parts := strings.Split(token, ".")
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims struct {
		K struct {
			Secret struct{ Name string }
		} `json:"kubernetes.io"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	s, err := c.CoreV1().Secrets("istio-system").Get(context.Background(), claims.K.Secret.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the Secret the token is bound to: %v", err)
	}
	return s.Labels["hub.federation/member-token-lineage"]
}

// watchGenerationDeleted sends, when generation gen of lineage is deleted
// in the member, the kubeconfig SHA-256 replica h reports for id at once.
func watchGenerationDeleted(ctx context.Context, t *testing.T, c kubernetes.Interface, lineage string, gen int, h *hubProcess, id string) <-chan string {
	t.Helper()
	w, err := c.CoreV1().Secrets("istio-system").Watch(ctx, metav1.ListOptions{
		LabelSelector: fmt.Sprintf("hub.federation/member-token-lineage=%s,hub.federation/generation=%d", lineage, gen),
	})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan string, 1)
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			if ev.Type == watch.Deleted {
				var cl api.Cluster
				if err := h.tryGetJSON("/api/v1/clusters/"+id, &cl); err != nil {
					out <- err.Error()
				} else {
					out <- cl.KubeconfigSHA256
				}
				return
			}
		}
	}()
	t.Cleanup(w.Stop)
	return out
}

// backgroundRegister is a `hub register` running in the background.
type backgroundRegister struct {
	done chan struct{}
	out  bytes.Buffer
	err  error
}

func startHubRegister(ctx context.Context, args ...string) *backgroundRegister {
	r := &backgroundRegister{done: make(chan struct{})}
	cmd := exec.CommandContext(ctx, hubBin, append([]string{"register"}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG=/nonexistent")
	cmd.Stdout, cmd.Stderr = &r.out, &r.out
	if r.err = cmd.Start(); r.err != nil {
		close(r.done)
		return r
	}
	go func() {
		defer close(r.done)
		r.err = cmd.Wait()
	}()
	return r
}

func (r *backgroundRegister) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (r *backgroundRegister) wait() (string, error) {
	<-r.done
	return r.out.String(), r.err
}

// roundRobin balances TCP connections over backends, each new connection
// to the next, as a Service's kube-proxy spreads them over its pods.
type roundRobin struct {
	url    string
	next   atomic.Int64
	counts []atomic.Int64 // connections per backend
}

func startRoundRobin(t *testing.T, backends ...string) *roundRobin {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rr := &roundRobin{url: "http://" + lis.Addr().String(), counts: make([]atomic.Int64, len(backends))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tcpproxy.Serve(ctx, lis, func(ctx context.Context, _ net.Conn) net.Conn {
			i := int(rr.next.Add(1)-1) % len(backends)
			rr.counts[i].Add(1)
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", backends[i])
			if err != nil {
				return nil
			}
			return c
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return rr
}

func (rr *roundRobin) count(i int) int64 { return rr.counts[i].Load() }

// heldProxy forwards TCP connections to target; while held, no byte moves
// either way and the connections stay open (a replica whose watch lags).
type heldProxy struct {
	addr string
	mu   sync.Mutex
	open chan struct{} // closed while bytes move
}

func startHeldProxy(t *testing.T, target string) *heldProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &heldProxy{addr: lis.Addr().String(), open: make(chan struct{})}
	close(p.open)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tcpproxy.Serve(ctx, lis, func(ctx context.Context, _ net.Conn) net.Conn {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", target)
			if err != nil {
				return nil
			}
			return &heldConn{Conn: c, p: p, ctx: ctx}
		})
	}()
	t.Cleanup(func() { p.release(); cancel(); <-done })
	return p
}

func (p *heldProxy) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default:
	}
}

func (p *heldProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}

func (p *heldProxy) gate(ctx context.Context) {
	p.mu.Lock()
	open := p.open
	p.mu.Unlock()
	select {
	case <-open:
	case <-ctx.Done():
	}
}

// heldConn is the upstream side of a heldProxy connection: what it reads
// is handed on, and what is written to it sent, only while not held.
type heldConn struct {
	net.Conn
	p   *heldProxy
	ctx context.Context
}

func (c *heldConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.p.gate(c.ctx)
	return n, err
}

func (c *heldConn) Write(b []byte) (int, error) {
	c.p.gate(c.ctx)
	return c.Conn.Write(b)
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

// rotatorKubeconfig writes a kubeconfig of member c for the ServiceAccount
// istio-system/hub-member-rotator bound by
// deploy/remote-member-rotation-rbac.yaml (applied, removed with the
// test), with a token of it, and checks the identity may not write RBAC.
func rotatorKubeconfig(ctx context.Context, t *testing.T, c *localcluster.Cluster, admin kubernetes.Interface) string {
	t.Helper()
	const rotator = "hub-member-rotator"
	if _, err := admin.CoreV1().ServiceAccounts("istio-system").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: rotator}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(deploy.RemoteMemberRotationRBAC), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		switch meta.Kind {
		// Replaced, not kept: a broader object left by an aborted run would
		// make "only the rotation rights" prove nothing.
		case "Role":
			var r rbacv1.Role
			if err := yaml.UnmarshalStrict([]byte(doc), &r); err != nil {
				t.Fatal(err)
			}
			_ = admin.RbacV1().Roles(r.Namespace).Delete(ctx, r.Name, metav1.DeleteOptions{})
			if _, err := admin.RbacV1().Roles(r.Namespace).Create(ctx, &r, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = admin.RbacV1().Roles(r.Namespace).Delete(context.Background(), r.Name, metav1.DeleteOptions{})
			})
		case "RoleBinding":
			var b rbacv1.RoleBinding
			if err := yaml.UnmarshalStrict([]byte(doc), &b); err != nil {
				t.Fatal(err)
			}
			_ = admin.RbacV1().RoleBindings(b.Namespace).Delete(ctx, b.Name, metav1.DeleteOptions{})
			if _, err := admin.RbacV1().RoleBindings(b.Namespace).Create(ctx, &b, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = admin.RbacV1().RoleBindings(b.Namespace).Delete(context.Background(), b.Name, metav1.DeleteOptions{})
			})
		default:
			t.Fatalf("deploy/remote-member-rotation-rbac.yaml holds a %q", meta.Kind)
		}
	}
	t.Cleanup(func() {
		_ = admin.CoreV1().ServiceAccounts("istio-system").Delete(context.Background(), rotator, metav1.DeleteOptions{})
	})
	tr, err := admin.CoreV1().ServiceAccounts("istio-system").CreateToken(ctx, rotator, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rotatorClient := memberTokenClient(t, c, tr.Status.Token)
	if _, err := rotatorClient.RbacV1().RoleBindings("istio-system").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "rotator-escalation"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "view"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: rotator, Namespace: "istio-system"}}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the rotator created a RoleBinding: %v; want Forbidden", err)
		if err == nil {
			_ = admin.RbacV1().RoleBindings("istio-system").Delete(ctx, "rotator-escalation", metav1.DeleteOptions{})
		}
	}
	cfg, err := clientcmd.Load(c.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range cfg.AuthInfos {
		*u = clientcmdapi.AuthInfo{Token: tr.Status.Token}
	}
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rotator.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
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
		case *corev1.ServiceAccount:
			live, err := c.CoreV1().ServiceAccounts(o.Namespace).Get(ctx, o.Name, metav1.GetOptions{})
			got, wantFields, gotFields = live, []any{o.Labels, o.Secrets, o.AutomountServiceAccountToken}, fieldsOf(err, func() any { return []any{live.Labels, live.Secrets, live.AutomountServiceAccountToken} })
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
		case *admissionv1.ValidatingAdmissionPolicy:
			live, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, o.Name, metav1.GetOptions{})
			got, wantFields, gotFields = live, []any{o.Spec.MatchConditions, o.Spec.Validations, o.Labels}, fieldsOf(err, func() any { return []any{live.Spec.MatchConditions, live.Spec.Validations, live.Labels} })
		case *admissionv1.ValidatingAdmissionPolicyBinding:
			live, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, o.Name, metav1.GetOptions{})
			got, wantFields, gotFields = live, []any{o.Spec.PolicyName, o.Spec.ValidationActions, o.Labels}, fieldsOf(err, func() any { return []any{live.Spec.PolicyName, live.Spec.ValidationActions, live.Labels} })
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

// checkMemberWritesOnlyHubGateways: in istio-system the member's token may
// create, update and delete a Service named hub-gateway-* labelled
// app.kubernetes.io/managed-by=hub (what the hub writes) and no other
// Service: the member's API server refuses it (the file's
// ValidatingAdmissionPolicy), though RBAC would allow it.
func checkMemberWritesOnlyHubGateways(ctx context.Context, t *testing.T, admin, member kubernetes.Interface) {
	t.Helper()
	svc := func(name string, labels map[string]string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: name, Labels: labels},
			Spec: corev1.ServiceSpec{ExternalIPs: []string{"198.19.99.1"}, Ports: []corev1.ServicePort{{Name: "tls", Port: 15443}}}}
	}
	hubs := map[string]string{"app.kubernetes.io/managed-by": "hub"}
	// istiod's Service, as Istio installs it.
	istiod, err := admin.CoreV1().Services("istio-system").Create(ctx, svc("istiod-"+rand.String(4), map[string]string{"app": "istiod"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.CoreV1().Services("istio-system").Delete(context.Background(), istiod.Name, metav1.DeleteOptions{})
	})
	byPolicy := func(err error) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "hub-gateway-*")
	}
	forbidden := func(what string, err error) {
		t.Helper()
		if !byPolicy(err) {
			t.Errorf("%s with the member's token: %v; want Forbidden by the hub-remote-member-writes policy", what, err)
		}
	}
	// The API server enforces a policy once its admission plugin has loaded
	// it, a moment after `hub register` applied it: wait for that (a
	// dry-run write runs admission and changes nothing).
	eventually(t, 60*time.Second, func() error {
		_, err := member.CoreV1().Services("istio-system").Create(ctx, svc("istiod-dry-run", hubs), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if !byPolicy(err) {
			return fmt.Errorf("a dry-run create of istio-system/istiod-dry-run with the member's token: %v; the policy is not enforced yet", err)
		}
		return nil
	})
	_, err = member.CoreV1().Services("istio-system").Create(ctx, svc("istiod-impostor", hubs), metav1.CreateOptions{})
	forbidden("creating istio-system/istiod-impostor", err)
	_, err = member.CoreV1().Services("istio-system").Create(ctx, svc("hub-gateway-unlabelled", nil), metav1.CreateOptions{})
	forbidden("creating an unlabelled hub-gateway-unlabelled", err)
	moved := istiod.DeepCopy()
	moved.Spec.ExternalIPs = []string{"198.19.99.66"}
	_, err = member.CoreV1().Services("istio-system").Update(ctx, moved, metav1.UpdateOptions{})
	forbidden("re-pointing istiod's Service", err)
	forbidden("deleting istiod's Service", member.CoreV1().Services("istio-system").Delete(ctx, istiod.Name, metav1.DeleteOptions{}))

	// What the hub writes, it may write.
	gw, err := member.CoreV1().Services("istio-system").Create(ctx, svc("hub-gateway-test-15443", hubs), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a hub-gateway Service with the member's token: %v", err)
	}
	gw.Spec.ExternalIPs = []string{"198.19.99.2"}
	if gw, err = member.CoreV1().Services("istio-system").Update(ctx, gw, metav1.UpdateOptions{}); err != nil {
		t.Errorf("updating it: %v", err)
	}
	unlabelled := gw.DeepCopy()
	unlabelled.Labels = nil
	_, err = member.CoreV1().Services("istio-system").Update(ctx, unlabelled, metav1.UpdateOptions{})
	forbidden("dropping the hub's label from hub-gateway-test-15443", err)
	if err := member.CoreV1().Services("istio-system").Delete(ctx, gw.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting it: %v", err)
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
	hashes map[string]int // kubeconfigSHA256 seen
	polls  int
}

func pollMember(h *hubProcess, id string) *memberPoller {
	ctx, cancel := context.WithCancel(context.Background())
	p := &memberPoller{cancel: cancel, done: make(chan struct{}), states: map[string]int{}, hashes: map[string]int{}}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			state, sha := memberState(ctx, h, id)
			if ctx.Err() != nil {
				return
			}
			p.mu.Lock()
			p.states[state]++
			if sha != "" {
				p.hashes[sha]++
			}
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

func (p *memberPoller) stop() (states, hashes map[string]int, polls int) {
	p.cancel()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.states, p.hashes, p.polls
}

// memberState is the member's state and kubeconfig SHA-256 from the API,
// or what went wrong.
func memberState(ctx context.Context, h *hubProcess, id string) (state, sha string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.adminURL+"/api/v1/clusters/"+id, nil)
	if err != nil {
		return err.Error(), ""
	}
	req.Header.Set("Authorization", "Bearer "+h.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "error: " + err.Error(), ""
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "HTTP " + resp.Status, ""
	}
	var c api.Cluster
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		return "decoding: " + err.Error(), ""
	}
	return c.State, c.KubeconfigSHA256
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
