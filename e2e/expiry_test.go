package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/internal/chromium"
	"github.com/hubmesh/hub/internal/localcluster"
)

// TestCredentialExpiry runs the hub binary with two members registered by
// kubeconfigs holding real TokenRequest tokens, one expiring in 3 days
// (inside the default 7-day --expiry-warning) and one in 30: the API,
// /metrics and the dashboard agree on each token's exp, only the first is
// badged ("expires in 2d") and warned of with a CredentialExpiring Event on
// its remote Secret; the trust API and metrics give our CA's expiry.
func TestCredentialExpiry(t *testing.T) {
	e := localcluster.Require(t, env)
	ctx := testContext(t)
	home, west := e.Cluster("primary"), e.Cluster("west")
	ns := hubNamespace(t, home)
	h := startHub(t, home, "--namespace", ns)

	type member struct {
		kubeconfig []byte
		exp        time.Time
	}
	members := map[string]member{}
	for id, ttl := range map[string]time.Duration{"soon": 3 * 24 * time.Hour, "later": 30 * 24 * time.Hour} {
		kc, exp, cleanup, err := west.AdminTokenKubeconfig(ctx, ttl)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cleanup)
		members[id] = member{kc, exp}
	}
	for id, m := range members {
		if _, err := client(t, home).CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, id, map[string][]byte{id: m.kubeconfig}), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 60*time.Second, func() error {
		cs := h.clusters(t)
		for id := range members {
			if cs[id].State != "Ready" {
				return fmt.Errorf("%s is %q", id, cs[id].State)
			}
		}
		return nil
	})

	// The API: each token's exp, graded; GET of one member as in the list.
	for id, want := range map[string]string{"soon": "expiring", "later": "valid"} {
		var c api.Cluster
		h.getJSON(t, "/api/v1/clusters/"+id, &c)
		if len(c.Credentials) != 1 || c.Credentials[0].Credential != "token" || c.Credentials[0].NotAfter == nil ||
			!c.Credentials[0].NotAfter.Equal(members[id].exp) || c.Credentials[0].State != want {
			t.Errorf("%s: credentials %+v; want a token expiring at %v, %s", id, c.Credentials, members[id].exp, want)
		}
	}
	if c := h.clusters(t)["soon"]; len(c.Credentials) != 1 || c.Credentials[0].Badge != "expires in 2d" {
		t.Errorf("soon in the list: %+v", c.Credentials)
	}

	// /metrics: the same times, and our CA's.
	text := h.scrapeMetrics(t)
	for id, m := range members {
		if v := labelled(text, `hub_member_credential_expiry_timestamp_seconds{cluster="`+id+`",credential="token"}`); v != float64(m.exp.Unix()) {
			t.Errorf("%s: metric %v; want %d", id, v, m.exp.Unix())
		}
	}
	var tds api.List[api.TrustDomain]
	h.getJSON(t, "/api/v1/trustdomains", &tds)
	if len(tds.Items) == 0 || tds.Items[0].CA == nil || tds.Items[0].CA.Root.State != "valid" || tds.Items[0].CA.Secret != ns+"/hub-trust-state" {
		t.Fatalf("trust domains %+v", tds.Items)
	}
	for name, want := range map[string]time.Time{
		"citadel_server_root_cert_expiry_timestamp":  tds.Items[0].CA.Root.NotAfter,
		"citadel_server_cert_chain_expiry_timestamp": tds.Items[0].CA.Chain.NotAfter,
	} {
		if v := labelled(text, name); v != float64(want.Unix()) {
			t.Errorf("%s = %v; want %d (the API's %v)", name, v, want.Unix(), want)
		}
	}

	// A Warning Event on the remote Secret of the member inside the window only.
	eventually(t, 30*time.Second, func() error {
		evs, err := client(t, home).CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=CredentialExpiring"})
		if err != nil {
			return err
		}
		if len(evs.Items) != 1 || evs.Items[0].InvolvedObject.Name != "soon" || evs.Items[0].Type != "Warning" ||
			!strings.Contains(evs.Items[0].Message, "expires at "+members["soon"].exp.Format(time.RFC3339)) {
			return fmt.Errorf("CredentialExpiring Events: %+v", evs.Items)
		}
		return nil
	})

	// The dashboard, server-rendered: a badge for soon, none for later.
	pages := dashboardPages(t, h.adminURL, h.token, "/clusters", "/clusters/soon", "/clusters/later")
	if !strings.Contains(pages["/clusters"], ">token expires in 2d</span>") || strings.Count(pages["/clusters"], "expiry-expiring") != 1 {
		t.Errorf("/clusters badges:\n%s", pages["/clusters"])
	}
	if !strings.Contains(pages["/clusters/soon"], "token expires in 2d") || strings.Contains(pages["/clusters/later"], "expiry-") {
		t.Errorf("cluster pages: soon %q, later has a badge: %v", pages["/clusters/soon"], strings.Contains(pages["/clusters/later"], "expiry-"))
	}

	// And in a real browser, where the badge is shown styled.
	if bctx := browserIfAvailable(t); bctx != nil {
		chromium.Do(t, bctx, "sign in", chromedp.Navigate(h.adminURL+"/clusters"), chromedp.WaitVisible(chromedp.ID("token")),
			chromedp.SetValue(chromedp.ID("token"), h.token), chromedp.Submit(chromedp.ID("token")),
			chromedp.WaitVisible(chromedp.CSS(`tr[data-cluster="soon"] .expiry-expiring`)))
		chromium.WaitText(t, bctx, `tr[data-cluster="soon"] .expiry-expiring`, "token expires in 2d", 10*time.Second)
		if chromium.Eval[bool](t, bctx, `document.querySelector('tr[data-cluster="later"] .expiry') !== null`) {
			t.Error("browser: the member outside the window has a badge")
		}
		if color := chromium.Eval[string](t, bctx, `getComputedStyle(document.querySelector('tr[data-cluster="soon"] .expiry-expiring')).color`); color != "rgb(125, 78, 0)" {
			t.Errorf("browser: the badge's colour is %s; want the warning colour rgb(125, 78, 0)", color)
		}
	}
}

// labelled is the value of the series named exactly (name and labels as
// /metrics prints them), NaN-free: -1 when absent.
func labelled(text, series string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}
