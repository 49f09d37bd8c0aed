package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/internal/chromium"
	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/xdstest"
)

// browserIfAvailable is chromium.Start for tests whose main subject is
// not the dashboard: outside CI without Chromium it returns nil instead of
// skipping.
func browserIfAvailable(t *testing.T) context.Context {
	t.Helper()
	if !chromium.Available() && os.Getenv("CI") == "" {
		t.Log("chromium not found; skipping the dashboard part of this test (outside CI only)")
		return nil
	}
	return chromium.Start(t)
}

// hubNamespace creates a fresh namespace in the home cluster for one hub.
func hubNamespace(t *testing.T, home *localcluster.Cluster) string {
	t.Helper()
	ns := "hub-" + rand.String(6)
	if err := localcluster.EnsureNamespace(testContext(t), client(t, home), ns); err != nil {
		t.Fatal(err)
	}
	return ns
}

func TestDashboard(t *testing.T) {
	e := localcluster.Require(t, env)
	ctx := chromium.Start(t)
	dir := chromium.Artifacts(t)
	kctx := testContext(t)
	home, west, east := e.Cluster("primary"), e.Cluster("west"), e.Cluster("east")
	ns := hubNamespace(t, home)
	h := startHub(t, home, "--namespace", ns)

	// Sign in.
	chromium.Do(t, ctx, "open the dashboard", chromedp.Navigate(h.adminURL+"/"), chromedp.WaitVisible(chromedp.ID("token")))
	chromium.Screenshot(t, ctx, dir, "01-signin")
	chromium.Do(t, ctx, "sign in",
		chromedp.SetValue(chromedp.ID("token"), home.AdminToken()),
		chromedp.Submit(chromedp.ID("token")),
		chromedp.WaitVisible(chromedp.CSS("#members-total")))
	chromium.WaitText(t, ctx, "#live-status", "Live", 10*time.Second)
	chromium.Screenshot(t, ctx, dir, "02-overview")

	// A member applied with kubectl appears live on the clusters page.
	chromium.Do(t, ctx, "open clusters", chromedp.Navigate(h.adminURL+"/clusters"), chromedp.WaitVisible(chromedp.CSS(`tr[data-cluster="primary"]`)))
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.__noReload = 1`)); err != nil {
		t.Fatal(err)
	}
	secrets := client(t, home).CoreV1().Secrets(ns)
	if _, err := secrets.Create(kctx, localcluster.RemoteSecret(ns, "west", map[string][]byte{"west": west.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	chromium.WaitText(t, ctx, `tr[data-cluster="west"]`, "Ready", 30*time.Second)
	requireNoReload(t, ctx)
	chromium.Screenshot(t, ctx, dir, "03-clusters-live")

	// A bad registration through the form shows the sanitiser's message.
	chromium.Do(t, ctx, "register a bad member",
		chromedp.SetValue(chromedp.ID("reg-id"), "evil"),
		chromedp.SetValue(chromedp.ID("reg-kc"), "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://1.2.3.4'}}]\nusers: [{name: u, user: {exec: {command: /bin/sh}}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"),
		chromedp.Click(chromedp.CSS(`form.register button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.ID("form-error")))
	chromium.WaitText(t, ctx, "#form-error", "exec credential plugins are not allowed", 5*time.Second)
	chromium.Screenshot(t, ctx, dir, "04-register-rejected")

	// Register east through the form.
	chromium.Do(t, ctx, "register east",
		chromedp.SetValue(chromedp.ID("reg-id"), "east"),
		chromedp.SetValue(chromedp.ID("reg-kc"), string(east.Kubeconfig())),
		chromedp.Click(chromedp.CSS(`form.register button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.ID("cluster-state")))
	chromium.WaitText(t, ctx, "#cluster-state", "Ready", 30*time.Second)
	if _, err := secrets.Get(kctx, "istio-remote-secret-east", metav1.GetOptions{}); err != nil {
		t.Fatalf("the form did not write the remote secret: %v", err)
	}
	chromium.Screenshot(t, ctx, dir, "05-cluster-east")

	// Kill east's API server: the page turns Stale without a reload.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.__noReload = 1`)); err != nil {
		t.Fatal(err)
	}
	east.StopAPIServer()
	t.Cleanup(func() {
		_ = east.StartAPIServer()
		_ = east.WaitReady(context.Background())
	})
	chromium.WaitText(t, ctx, "#cluster-state", "Stale", 60*time.Second)
	requireNoReload(t, ctx)
	chromium.Screenshot(t, ctx, dir, "06-cluster-east-stale")
	if err := east.StartAPIServer(); err != nil {
		t.Fatal(err)
	}

	// A proxy that NACKs shows up with its error.
	nackingProxy(t, h.xdsAddr, "nack-proxy", "cluster rejected by test proxy")
	chromium.Do(t, ctx, "open proxies", chromedp.Navigate(h.adminURL+"/proxies"), chromedp.WaitVisible(chromedp.CSS("table")))
	chromium.WaitText(t, ctx, "main", "cluster rejected by test proxy", 30*time.Second)
	chromium.WaitText(t, ctx, "main", "NACK", 5*time.Second)
	chromium.Screenshot(t, ctx, dir, "07-proxies-nack")
	chromium.Do(t, ctx, "open the proxy", chromedp.Navigate(h.adminURL+"/proxies/nack-proxy"), chromedp.WaitVisible(chromedp.CSS("pre.config")))
	chromium.Screenshot(t, ctx, dir, "08-proxy")

	chromium.Do(t, ctx, "open services", chromedp.Navigate(h.adminURL+"/services"), chromedp.WaitVisible(chromedp.CSS("table")))
	chromium.Screenshot(t, ctx, dir, "09-services")
	// The overview's picture shows the real members Ready and the proxy
	// (of no member: it sends no CLUSTER_ID) connected to the hub.
	chromium.Do(t, ctx, "open overview", chromedp.Navigate(h.adminURL+"/"), chromedp.WaitVisible(chromedp.CSS("#members-total")),
		chromedp.WaitReady(chromedp.CSS(`svg#federation g.member[data-cluster="primary"][data-state="Ready"][data-home="true"]`)),
		chromedp.WaitReady(chromedp.CSS(`svg#federation g.member[data-cluster="west"][data-state="Ready"]`)),
		chromedp.WaitReady(chromedp.CSS(`svg#federation g.proxies.unassigned[data-count="1"]`)))
	chromium.Screenshot(t, ctx, dir, "10-overview-after")

	// Phone width.
	chromium.Do(t, ctx, "phone", chromedp.EmulateViewport(390, 844), chromedp.Navigate(h.adminURL+"/clusters"), chromedp.WaitVisible(chromedp.CSS("table")))
	chromium.Screenshot(t, ctx, dir, "11-clusters-phone")

	// No page ever shows credentials.
	for _, path := range []string{"/", "/clusters", "/clusters/east", "/clusters/west", "/services", "/proxies", "/proxies/nack-proxy"} {
		chromium.Do(t, ctx, "open "+path, chromedp.Navigate(h.adminURL+path), chromedp.WaitVisible(chromedp.CSS("h1")))
		requireNoSecrets(t, path, chromium.PageHTML(t, ctx), home, west, east)
	}

	// Forms without the session's CSRF token are refused.
	status, err := chromedp.Run(ctx, chromedp.Evaluate[int](`fetch("/clusters", {method: "POST", body: new URLSearchParams({id: "forged", kubeconfig: "x"})}).then(r => r.status)`, awaitPromise))
	if err != nil || status != 403 {
		t.Errorf("POST without CSRF token: %d, %v; want 403", status, err)
	}

	// Remove west through its page.
	chromium.Do(t, ctx, "remove west", chromedp.Navigate(h.adminURL+"/clusters/west"), chromedp.WaitVisible(chromedp.CSS("button.danger")),
		chromedp.Click(chromedp.CSS("button.danger")), chromedp.WaitVisible(chromedp.CSS(`tr[data-cluster="primary"]`)))
	eventually(t, 30*time.Second, func() error {
		if _, err := secrets.Get(kctx, "west", metav1.GetOptions{}); err == nil {
			return fmt.Errorf("west's secret still exists")
		}
		return nil
	})
	chromium.Do(t, ctx, "west gone", chromedp.WaitNotPresent(chromedp.CSS(`tr[data-cluster="west"]`)))

	// Sign out ends the session.
	chromium.Do(t, ctx, "sign out", chromedp.Click(chromedp.CSS(".signout button")), chromedp.WaitVisible(chromedp.ID("token")))
	t.Logf("screenshots in %s", dir)
}

// awaitPromise makes Evaluate wait for a promise's value.
func awaitPromise(p *runtime.EvaluateParams) { p.AwaitPromise = ptrTrue() }

func ptrTrue() *bool { v := true; return &v }

func requireNoReload(t *testing.T, ctx context.Context) {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.__noReload || 0`))
	if err != nil || v != 1 {
		t.Fatalf("the page was reloaded (marker %d, %v); updates must arrive live", v, err)
	}
}

// requireNoSecrets fails if body contains any credential of the clusters.
func requireNoSecrets(t *testing.T, where, body string, cs ...*localcluster.Cluster) {
	t.Helper()
	markers := []string{"PRIVATE KEY", "client-key-data", "client-certificate-data", "BEGIN CERTIFICATE", "token:"}
	for _, c := range cs {
		markers = append(markers, c.AdminToken())
		// Any 40-character run of a kubeconfig's base64 key material.
		kc := string(c.Kubeconfig())
		if i := strings.Index(kc, "client-key-data: "); i >= 0 {
			markers = append(markers, kc[i+17:i+57])
		}
	}
	for _, m := range markers {
		if strings.Contains(body, m) {
			t.Errorf("%s contains credential material %q", where, m)
		}
	}
}

// nackingProxy connects a raw ADS client that NACKs every CDS response.
func nackingProxy(t *testing.T, xdsAddr, id, reason string) {
	t.Helper()
	first := &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: id}, TypeUrl: resourcev3.ClusterType}
	xdstest.Answer(t, xdstest.Dial(t, xdsAddr), first, func(resp *discoveryv3.DiscoveryResponse) *discoveryv3.DiscoveryRequest {
		return &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: resp.Nonce, ErrorDetail: &statuspb.Status{Code: 3, Message: reason}}
	})
}
