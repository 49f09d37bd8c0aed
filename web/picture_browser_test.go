package web

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/internal/chromium"
)

// TestPictureInChromium: the overview's picture in real Chromium shows each
// member's state, follows a state change live (no reload), and is drawn at
// desktop and phone width with 3 and with 50 members (screenshots).
func TestPictureInChromium(t *testing.T) {
	ctx := chromium.Start(t)
	dir := chromium.Artifacts(t)
	models := federation(3)
	s := startServer(t, models.config(), ServerOptions{}, nil)
	errs := chromium.WatchErrors(t, ctx)
	chromium.Do(t, ctx, "sign in", chromedp.Navigate(s.base+"/signin"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SetValue(chromedp.ID("token"), "good"), chromedp.Submit(chromedp.ID("token")),
		chromedp.WaitVisible(chromedp.CSS("svg#federation")))
	chromium.WaitJS(t, ctx, `document.getElementById("live-status").textContent.includes("Live")`, 30*time.Second)

	for _, id := range []string{"primary", "west", "east", "north"} {
		sel := fmt.Sprintf(`svg#federation g.member[data-cluster=%q][data-state="Ready"]`, id)
		if !chromium.Eval[bool](t, ctx, fmt.Sprintf(`!!document.querySelector(%q)`, sel)) {
			t.Errorf("no %s in the picture", sel)
		}
	}
	if got := chromium.Eval[string](t, ctx, `document.querySelector('svg#federation g.proxies[data-cluster="east"]').dataset.count`); got != "2" {
		t.Errorf("east's proxies: data-count %q; want 2", got)
	}
	if !chromium.Eval[bool](t, ctx, `!!document.querySelector('svg#federation g.subscribers[data-cluster="east"][data-count="1"]')`) {
		t.Errorf("east's istiod is not in the picture")
	}
	if !chromium.Eval[bool](t, ctx, `!!document.querySelector('svg#federation g.trustdomain[data-trust-domain="partner.example.org"][data-state="Ready"]')`) {
		t.Errorf("the federated trust domain is not in the picture")
	}
	chromium.Screenshot(t, ctx, dir, "01-desktop-3-members")
	errs.Check(t) // no CSP violation, no script error

	// A member turns Stale in the read model: the picture follows, live.
	chromium.Eval[int](t, ctx, `window.__noReload = 1`)
	models.setState("west", clusters.StateStale)
	chromium.WaitJS(t, ctx, `document.querySelector('svg#federation g.member[data-cluster="west"][data-state="Stale"]')`, 30*time.Second)
	if chromium.Eval[int](t, ctx, `window.__noReload || 0`) != 1 {
		t.Fatal("the page was reloaded; the picture must update live")
	}
	if got := chromium.Eval[string](t, ctx, `document.querySelector('svg#federation g.member[data-cluster="west"] .sub .state-text').textContent`); got != "Stale" {
		t.Errorf("west's card says %q; want Stale (text, not colour alone)", got)
	}
	chromium.Screenshot(t, ctx, dir, "02-desktop-3-members-west-stale")

	chromium.Do(t, ctx, "phone width", chromedp.EmulateViewport(390, 844), chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("svg#federation-compact")))
	if chromium.Eval[bool](t, ctx, `getComputedStyle(document.getElementById("federation")).display !== "none"`) {
		t.Errorf("the wide picture is shown at phone width")
	}
	checkFits(t, ctx)
	chromium.Screenshot(t, ctx, dir, "03-phone-3-members")

	// 50 members.
	many := federation(50)
	models.mu.Lock()
	models.members, models.proxies, models.tds = many.members, many.proxies, many.tds
	models.mu.Unlock()
	chromium.Do(t, ctx, "reload with 50 members", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`svg#federation-compact[data-members="51"]`)))
	checkFits(t, ctx)
	chromium.Screenshot(t, ctx, dir, "04-phone-50-members")
	chromium.Do(t, ctx, "desktop with 50 members", chromedp.EmulateViewport(1280, 800), chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`svg#federation[data-members="51"]`)))
	if n := chromium.Eval[int](t, ctx, `document.querySelectorAll("svg#federation g.member").length`); n != 51 {
		t.Errorf("desktop picture draws %d of 51 members", n)
	}
	checkFits(t, ctx)
	chromium.Screenshot(t, ctx, dir, "05-desktop-50-members")

	// A member whose ID is markup arrives live as text: nothing runs.
	evil := `<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'"`
	models.mu.Lock()
	models.members = append(models.members, clusters.Status{ID: evil, Secret: "ns/evil", State: clusters.StateInvalid, Message: evil})
	models.mu.Unlock()
	chromium.WaitJS(t, ctx, fmt.Sprintf(`[...document.querySelectorAll("svg#federation g.member")].some(g => g.dataset.cluster === %q && g.dataset.state === "Invalid")`, evil), 30*time.Second)
	if v := chromium.Eval[int](t, ctx, `window.__pwned || 0`); v != 0 {
		t.Errorf("a member's ID ran script (%d)", v)
	}
	if n := chromium.Eval[int](t, ctx, `document.querySelectorAll("main img, main script").length`); n != 0 {
		t.Errorf("a member's ID made %d elements", n)
	}
	errs.Check(t)
	t.Logf("screenshots in %s", dir)
}

// checkFits fails if the page scrolls sideways or the shown picture's text
// is smaller than 10 CSS pixels.
func checkFits(t *testing.T, ctx context.Context) {
	t.Helper()
	if w := chromium.Eval[int](t, ctx, `document.documentElement.scrollWidth - document.documentElement.clientWidth`); w > 0 {
		t.Errorf("the page scrolls sideways by %d px", w)
	}
	smallest := chromium.Eval[float64](t, ctx, `(() => {
		const svg = [...document.querySelectorAll("svg.federation")].find(s => getComputedStyle(s).display !== "none");
		let min = 1e9;
		for (const el of svg.querySelectorAll("text")) {
			const r = el.getBoundingClientRect();
			if (r.height > 0) { min = Math.min(min, r.height); }
		}
		return min;
	})()`)
	if smallest < 10 {
		t.Errorf("the picture's smallest text is %.1f px tall", smallest)
	}
}
