package e2e

import (
	"context"
	"fmt"
	"html"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/hubmesh/hub/internal/chromium"
	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/wait"
)

// TestSecurityWebCrossSiteSignIn replays login CSRF in real Chromium
// against the real hub: a page of another site (here http://localhost:<port>,
// the hub being on 127.0.0.1) submits a sign-in form with the attacker's own
// token. Had it worked, the victim's browser would hold the attacker's
// session and everything the victim then did in the dashboard (pasting a
// kubeconfig, say) would happen in it. The hub must refuse it and set no
// cookie; its own sign-in form keeps working (TestDashboard).
func TestSecurityWebCrossSiteSignIn(t *testing.T) {
	e := localcluster.Require(t, env)
	ctx := browserIfAvailable(t)
	if ctx == nil {
		return
	}
	home := e.Cluster("primary")
	ns := hubNamespace(t, home)
	h := startHub(t, home, "--namespace", ns)

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	attacker := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><form id="f" method="post" action="%s/signin">`+
			`<input name="token" value="%s"><input name="next" value="/"></form>`+
			`<script>document.getElementById("f").submit()</script>`,
			html.EscapeString(h.adminURL), html.EscapeString(home.AdminToken()))
	})}
	go func() { _ = attacker.Serve(lis) }()
	t.Cleanup(func() { _ = attacker.Close() })
	_, port, _ := net.SplitHostPort(lis.Addr().String())
	attackerURL := "http://localhost:" + port + "/"
	if !strings.Contains(h.adminURL, "127.0.0.1") {
		t.Fatalf("the hub's admin URL %s is not on 127.0.0.1: the attacker's page would not be on another site", h.adminURL)
	}

	chromium.Do(t, ctx, "open the attacker's page", chromedp.Navigate(attackerURL))
	// The form submits itself; wait until the browser is on the hub's answer.
	wait.Until(t, 30*time.Second, func() error {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		loc, err := chromedp.Run(tctx, chromedp.Location())
		if err != nil || !strings.HasPrefix(loc, h.adminURL) {
			return fmt.Errorf("the attacker's form has not reached the hub: at %s (%v)", loc, err)
		}
		return nil
	})
	chromium.Do(t, ctx, "load the hub's answer", chromedp.WaitReady(chromedp.CSS("body")))
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	body, err := chromedp.Run(tctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(body, "cross-site request refused") {
		t.Errorf("the hub did not refuse the cross-site sign-in; it answered %q", body)
	}
	// The browser holds no session: the dashboard sends it to sign in.
	chromium.Do(t, ctx, "open the dashboard", chromedp.Navigate(h.adminURL+"/clusters"), chromedp.WaitReady(chromedp.CSS("body")))
	if loc, err := chromedp.Run(tctx, chromedp.Location()); err != nil || !strings.HasPrefix(loc, h.adminURL+"/signin") {
		t.Errorf("after the attacker's sign-in the dashboard is at %s (%v); want the sign-in page", loc, err)
	}
}
