package e2e

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/distribute"
	"github.com/hubmesh/hub/internal/chromium"
	"github.com/hubmesh/hub/internal/localcluster"
)

// istioObjects creates and deletes Istio objects in a cluster, labelled
// for distribution unless unlabelled says not.
type istioObjects struct {
	t          *testing.T
	dyn        dynamic.Interface
	unlabelled bool
}

var (
	authorizationPolicies = schema.GroupVersionResource{Group: "security.istio.io", Version: "v1", Resource: "authorizationpolicies"}
	peerAuthentications   = schema.GroupVersionResource{Group: "security.istio.io", Version: "v1", Resource: "peerauthentications"}
	destinationRules      = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "destinationrules"}
)

func (o istioObjects) apply(gvr schema.GroupVersionResource, ns, name string, spec map[string]any) {
	o.t.Helper()
	kind := map[string]string{"authorizationpolicies": "AuthorizationPolicy", "peerauthentications": "PeerAuthentication", "destinationrules": "DestinationRule"}[gvr.Resource]
	meta := map[string]any{"name": name, "namespace": ns}
	if !o.unlabelled {
		meta["labels"] = map[string]any{distribute.Label: "true"}
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvr.Group + "/" + gvr.Version, "kind": kind, "metadata": meta, "spec": spec,
	}}
	if _, err := o.dyn.Resource(gvr).Namespace(ns).Create(testContext(o.t), u, metav1.CreateOptions{}); err != nil {
		o.t.Fatalf("creating %s %s/%s: %v", kind, ns, name, err)
	}
	// Gone with the test: every hub of the shared home cluster sees
	// labelled objects (and reports those of namespaces it does not
	// distribute from).
	o.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = o.dyn.Resource(gvr).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{})
	})
}

func (o istioObjects) remove(gvr schema.GroupVersionResource, ns, name string) {
	o.t.Helper()
	if err := o.dyn.Resource(gvr).Namespace(ns).Delete(testContext(o.t), name, metav1.DeleteOptions{}); err != nil {
		o.t.Fatalf("deleting %s/%s: %v", ns, name, err)
	}
}

// policyServerUpdates is the hub's hub_xds_policy_server_updates_total.
func policyServerUpdates(t *testing.T, h *hubProcess) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^hub_xds_policy_server_updates_total (\d+)`).FindStringSubmatch(h.scrapeMetrics(t))
	if m == nil {
		t.Fatal("no hub_xds_policy_server_updates_total in the hub's metrics")
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// settle waits until n lines in a row of c satisfy ok (after what c
// printed before), so that a policy change has reached every connection.
func settle(t *testing.T, c *child, what string, n int, ok func(string) bool) {
	t.Helper()
	deadline := time.After(90 * time.Second)
	inARow, last := 0, ""
	for inARow < n {
		select {
		case l, open := <-c.lines:
			if !open {
				t.Fatalf("%s: the client exited (last line %q)", what, last)
			}
			last = l
			if ok(l) {
				inARow++
			} else {
				inARow = 0
			}
		case <-deadline:
			t.Fatalf("%s: not %d lines in a row within 90s (last line %q)", what, n, last)
		}
	}
}

// seen reads n more lines of c and fails unless each of the prefixes
// starts one of them.
func seen(t *testing.T, c *child, what string, n int, prefixes ...string) {
	t.Helper()
	found := map[string]bool{}
	for range n {
		l := c.waitLine(t, 30*time.Second, "")
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				found[p] = true
			}
		}
	}
	for _, p := range prefixes {
		if !found[p] {
			t.Fatalf("%s: no line %q among the next %d", what, p, n)
		}
	}
}

// TestProxylessAuthorizationPolicies (issue 23): grpc-go xDS servers
// (xDS server credentials) in two members and one in another namespace,
// each behind its real pilot-agent, and grpc-go xDS clients with their own
// ServiceAccounts behind theirs, while the mesh is PERMISSIVE. Distributed
// from the home cluster: a namespace PeerAuthentication STRICT with a
// DestinationRule ISTIO_MUTUAL → the xDS-credentials clients call over
// mTLS and a plaintext client is refused there only (the other namespace
// still answers it); an AuthorizationPolicy allowing one principal → the
// other client gets PermissionDenied, and the push reached exactly the two
// servers it selects; a DENY of one gRPC method → that method denied, the
// other still served; everything removed → every call succeeds again,
// without restarting a client. Policies in a member's own API server, or
// not labelled for distribution, are not read. No NACKs; the API shows
// each server's policies and mode.
func TestProxylessAuthorizationPolicies(t *testing.T) {
	e := localcluster.Require(t, env)
	pilotAgentBin(t)
	ctx := testContext(t)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	app, open, root := "authz-"+rand.String(5), "authzo-"+rand.String(5), "authzr-"+rand.String(5)
	for _, c := range []*localcluster.Cluster{home, west, east} {
		for _, ns := range []string{app, open} {
			if err := localcluster.EnsureNamespace(ctx, client(t, c), ns); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := localcluster.EnsureNamespace(ctx, client(t, home), root); err != nil {
		t.Fatal(err)
	}
	installIstioCRDs(t, home)
	dyn, err := dynamic.NewForConfig(home.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	objs := istioObjects{t: t, dyn: dyn}
	h := startAgentHub(t, e, spiffeid.RequireTrustDomainFromString("authz.test"), "--mtls-mode", "PERMISSIVE",
		"--root-namespace", root, "--distribute-namespaces", strings.Join([]string{root, app, open}, ","))
	ip := dataPlaneIP(t)
	labels := `ISTIO_METAJSON_LABELS={"app":"echo"}`

	// The servers: echo in app in west and in east, echo in open in west.
	serve := func(member *localcluster.Cluster, ns, id string) *child {
		t.Helper()
		a := h.agent(t, member, ns, "echo", labels)
		srv := startChild(t, "xdsserver", serverListenEnv+"="+net.JoinHostPort(ip, "0"), serverIDEnv+"="+id, "GRPC_XDS_BOOTSTRAP="+a.BootstrapPath)
		addr, err := net.ResolveTCPAddr("tcp", strings.TrimPrefix(srv.waitLine(t, 30*time.Second, "listening "), "listening "))
		if err != nil {
			t.Fatal(err)
		}
		if err := localcluster.ApplyService(ctx, client(t, member), ns, "echo", "grpc", 7070,
			[]localcluster.Backend{{IP: addr.IP.String(), Port: int32(addr.Port)}}); err != nil {
			t.Fatal(err)
		}
		srv.waitLine(t, 60*time.Second, "serving")
		return srv
	}
	serve(west, app, "west")
	serve(east, app, "east")
	serve(west, open, "open")

	// The clients, in east: alice and bob with xDS credentials (alice also
	// calls EmptyCall), plain and plainOpen with insecure credentials
	// calling app's and open's echo (one target per agent: grpc-go opens
	// an xDS stream per target, and an agent serves one at a time).
	appTarget := fmt.Sprintf("xds:///echo.%s.svc.cluster.local:7070", app)
	openTarget := fmt.Sprintf("xds:///echo.%s.svc.cluster.local:7070", open)
	call := func(sa, target string, env ...string) *child {
		t.Helper()
		a := h.agent(t, east, app, sa)
		return startChild(t, "xdsclient", append([]string{clientTargetEnv + "=" + target, "GRPC_XDS_BOOTSTRAP=" + a.BootstrapPath}, env...)...)
	}
	alice := call("alice", appTarget, clientCredsEnv+"=xds", clientEmptyCallEnv+"=1")
	bob := call("bob", appTarget, clientCredsEnv+"=xds")
	plain := call("plain", appTarget)
	plainOpen := call("plain-open", openTarget)
	id := func(sa string) string { return "spiffe://authz.test/ns/" + app + "/sa/" + sa }
	okFrom := func(l string) bool { return l == "ok west peer=-" || l == "ok east peer=-" } // plaintext: the server sees no identity
	settle(t, alice, "alice, no policy (plaintext)", 20, func(l string) bool { return l == "empty ok" || okFrom(l) })
	settle(t, bob, "bob, no policy", 20, okFrom)
	settle(t, plain, "plain, no policy", 20, okFrom)
	settle(t, plainOpen, "plain-open, no policy", 20, func(l string) bool { return l == "ok open peer=-" })

	// Only distributed policies count: a deny-all AuthorizationPolicy in
	// a member's own API server, and one in the home cluster without the
	// distribution label, change nothing for the hub's proxyless servers.
	installIstioCRDs(t, west)
	westDyn, err := dynamic.NewForConfig(west.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	denyAll := map[string]any{"action": "DENY", "rules": []any{map[string]any{}}}
	istioObjects{t: t, dyn: westDyn, unlabelled: true}.apply(authorizationPolicies, app, "member-local-deny-all", denyAll)
	istioObjects{t: t, dyn: dyn, unlabelled: true}.apply(authorizationPolicies, app, "unlabelled-deny-all", denyAll)
	settle(t, bob, "bob, with member-local and unlabelled deny-all policies", 20, okFrom)
	// STRICT in app (the mesh stays PERMISSIVE) and ISTIO_MUTUAL for its
	// echo: alice and bob call over mTLS, plain is refused in app only.
	objs.apply(peerAuthentications, app, "strict", map[string]any{"mtls": map[string]any{"mode": "STRICT"}})
	objs.apply(destinationRules, app, "echo-mtls", map[string]any{"host": "echo", "trafficPolicy": map[string]any{"tls": map[string]any{"mode": "ISTIO_MUTUAL"}}})
	mtlsFrom := func(sa string) func(string) bool {
		return func(l string) bool {
			return l == "ok west peer="+id(sa) || l == "ok east peer="+id(sa) || (sa == "alice" && l == "empty ok")
		}
	}
	settle(t, alice, "alice over mTLS", 20, mtlsFrom("alice"))
	settle(t, bob, "bob over mTLS", 20, mtlsFrom("bob"))
	settle(t, plain, "plain: app refused", 10, func(l string) bool { return strings.HasPrefix(l, "err ") })
	settle(t, plainOpen, "plain-open: open still answering", 20, func(l string) bool { return l == "ok open peer=-" })

	// The API shows the servers' mode and the policies deciding it.
	ids := map[string]string{} // member/namespace → the server's proxy ID
	servers := func() map[string]api.ProxyServer {
		var ps struct{ Items []api.Proxy }
		h.getJSON(t, "/api/v1/proxies", &ps)
		out := map[string]api.ProxyServer{}
		for _, p := range ps.Items {
			if p.Server != nil {
				out[p.Cluster+"/"+p.Server.Workload.Namespace] = *p.Server
				ids[p.Cluster+"/"+p.Server.Workload.Namespace] = p.ID
			}
		}
		return out
	}
	eventually(t, 30*time.Second, func() error {
		s := servers()
		for _, k := range []string{west.Name + "/" + app, east.Name + "/" + app, west.Name + "/" + open} {
			srv, ok := s[k]
			if !ok || len(srv.Listeners) != 1 {
				return fmt.Errorf("no server %s with one inbound listener in the API: %+v", k, s)
			}
			want := "STRICT"
			if strings.HasSuffix(k, open) {
				want = "DISABLE"
			}
			if l := srv.Listeners[0]; l.Mode != want || !srv.Workload.Verified || srv.Workload.ServiceAccount != "echo" {
				return fmt.Errorf("server %s: %+v; want mode %s, verified workload of echo", k, srv, want)
			}
		}
		if pas := s[west.Name+"/"+app].PeerAuthentications; len(pas) != 1 || pas[0] != app+"/strict" {
			return fmt.Errorf("west's app server: PeerAuthentications %v; want %s/strict", pas, app)
		}
		return nil
	})

	// Only alice may call app's echo: bob is denied. The push reached the
	// two servers the policy selects, not open's.
	before := policyServerUpdates(t, h.hubProcess)
	objs.apply(authorizationPolicies, app, "only-alice", map[string]any{
		"selector": map[string]any{"matchLabels": map[string]any{"app": "echo"}},
		"rules":    []any{map[string]any{"from": []any{map[string]any{"source": map[string]any{"principals": []any{"authz.test/ns/" + app + "/sa/alice"}}}}}},
	})
	settle(t, bob, "bob denied", 10, func(l string) bool { return strings.HasPrefix(l, "err ") && strings.Contains(l, "PermissionDenied") })
	settle(t, alice, "alice still allowed", 20, mtlsFrom("alice"))
	if n := policyServerUpdates(t, h.hubProcess) - before; n != 2 {
		t.Errorf("the ALLOW policy re-evaluated %d servers' inbound listeners; want 2 (app's echo in west and east, not open's)", n)
	}
	eventually(t, 30*time.Second, func() error {
		srv := servers()[west.Name+"/"+app]
		if len(srv.Allow) != 1 || srv.Allow[0] != app+"/only-alice" || len(srv.Deny) != 0 {
			return fmt.Errorf("west's app server: ALLOW %v, DENY %v; want only %s/only-alice, and no DENY (the deny-all policies are not distributed)", srv.Allow, srv.Deny, app)
		}
		return nil
	})

	// The proxy page, in a real browser, shows the same.
	if bctx := browserIfAvailable(t); bctx != nil {
		chromium.Do(t, bctx, "sign in", chromedp.Navigate(h.adminURL+"/"), chromedp.WaitVisible(chromedp.ID("token")),
			chromedp.SetValue(chromedp.ID("token"), e.Cluster("primary").AdminToken()), chromedp.Submit(chromedp.ID("token")),
			chromedp.WaitVisible(chromedp.CSS("#members-total")))
		chromium.Do(t, bctx, "open west's server", chromedp.Navigate(h.adminURL+"/proxies/"+url.PathEscape(ids[west.Name+"/"+app])),
			chromedp.WaitVisible(chromedp.CSS("dl.server-security")))
		chromium.Screenshot(t, bctx, chromium.Artifacts(t), "authz-proxy-server")
		page := chromium.PageHTML(t, bctx)
		for _, want := range []string{app + "/only-alice", app + "/strict", `class="mtls-mode">STRICT`, "from its verified identity"} {
			if !strings.Contains(page, want) {
				t.Errorf("the proxy page does not show %q", want)
			}
		}
	}

	// DENY one gRPC method: alice's EmptyCall is denied, her UnaryCall
	// still served.
	objs.apply(authorizationPolicies, app, "no-empty", map[string]any{
		"action": "DENY",
		"rules":  []any{map[string]any{"to": []any{map[string]any{"operation": map[string]any{"paths": []any{"/grpc.testing.TestService/EmptyCall"}}}}}},
	})
	settle(t, alice, "alice's EmptyCall denied, UnaryCall served", 20, func(l string) bool {
		return (strings.HasPrefix(l, "empty err ") && strings.Contains(l, "PermissionDenied")) || l == "ok west peer="+id("alice") || l == "ok east peer="+id("alice")
	})
	seen(t, alice, "alice's EmptyCall denied, UnaryCall served", 10, "empty err ", "ok ")

	// Everything removed: every client is served again, in plaintext, by
	// the same processes.
	objs.remove(authorizationPolicies, app, "no-empty")
	objs.remove(authorizationPolicies, app, "only-alice")
	objs.remove(destinationRules, app, "echo-mtls")
	objs.remove(peerAuthentications, app, "strict")
	settle(t, alice, "alice after the policies went", 20, func(l string) bool { return l == "empty ok" || okFrom(l) })
	settle(t, bob, "bob after the policies went", 20, okFrom)
	settle(t, plain, "plain after the policies went", 20, okFrom)
	settle(t, plainOpen, "plain-open after the policies went", 20, func(l string) bool { return l == "ok open peer=-" })
	noNacks(t, h.hubProcess, app)
}
