package web

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/internal/chromium"
)

// TestPictureInChromium: the overview's picture in real Chromium shows each
// member's state, follows a state change live (no reload), shows members'
// networks, gateways and demotion as they arrive, and is drawn at desktop
// and phone width with 3 and with 50 members (screenshots).
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

	// The members join networks and west is demoted: the picture follows,
	// live.
	models.setNetworks()
	models.demote("west", "the member is Stale: its endpoints are served one priority behind the healthy members'")
	chromium.WaitJS(t, ctx, `document.querySelector('svg#federation g.member[data-cluster="west"][data-demoted="true"]')`, 30*time.Second)
	if chromium.Eval[int](t, ctx, `window.__noReload || 0`) != 1 {
		t.Fatal("the page was reloaded; the picture must update live")
	}
	checkNetworks(t, ctx, "federation")
	checkTextInCards(t, ctx, "federation")
	errs.Check(t)
	chromium.Screenshot(t, ctx, dir, "03-desktop-3-members-networks")

	chromium.Do(t, ctx, "phone width", chromedp.EmulateViewport(390, 844), chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("svg#federation-compact")))
	if chromium.Eval[bool](t, ctx, `getComputedStyle(document.getElementById("federation")).display !== "none"`) {
		t.Errorf("the wide picture is shown at phone width")
	}
	checkFits(t, ctx)
	checkNetworks(t, ctx, "federation-compact")
	checkTextInCards(t, ctx, "federation-compact")
	chromium.Screenshot(t, ctx, dir, "04-phone-3-members")

	// 50 members, on networks, two of them demoted.
	many := federation(50)
	many.setNetworks()
	many.demote("member-30", "the member is Stale: its endpoints are served one priority behind the healthy members'")
	many.demote("member-49", "the member is Stale: its endpoints are served one priority behind the healthy members'")
	for i := range many.members { // a long network without a gateway, and demoted: the fullest row
		if many.members[i].ID == "member-49" {
			many.members[i].Network, many.members[i].Gateways = "mesh-network-eu-west-1-production", nil
		}
	}
	models.mu.Lock()
	models.members, models.proxies, models.tds = many.members, many.proxies, many.tds
	models.mu.Unlock()
	chromium.Do(t, ctx, "reload with 50 members", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`svg#federation-compact[data-members="51"]`)))
	checkFits(t, ctx)
	checkTextInCards(t, ctx, "federation-compact")
	for _, id := range []string{"member-30", "member-49"} {
		if !chromium.Eval[bool](t, ctx, fmt.Sprintf(`!!document.querySelector('svg#federation-compact g.member[data-cluster=%q][data-demoted="true"] .demoted-tag')`, id)) {
			t.Errorf("the compact picture hides demoted %s", id)
		}
	}
	chromium.Screenshot(t, ctx, dir, "05-phone-50-members")
	chromium.Do(t, ctx, "desktop with 50 members", chromedp.EmulateViewport(1280, 800), chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`svg#federation[data-members="51"]`)))
	if n := chromium.Eval[int](t, ctx, `document.querySelectorAll("svg#federation g.member").length`); n != 51 {
		t.Errorf("desktop picture draws %d of 51 members", n)
	}
	checkFits(t, ctx)
	if got := chromium.Eval[string](t, ctx, `document.querySelector('svg#federation g.member[data-cluster="member-10"] .net-name').textContent`); got != "net-east" {
		t.Errorf("member-10's dot says the network %q; want net-east", got)
	}
	if got := chromium.Eval[string](t, ctx, `document.querySelector('svg#federation g.member[data-cluster="member-12"] .gw-none').textContent`); got != "⇄0" {
		t.Errorf("member-12's dot says its gateways %q; want ⇄0", got)
	}
	chromium.Screenshot(t, ctx, dir, "06-desktop-50-members")

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

// checkNetworks fails unless the shown picture (svg#id) says each member's
// network and gateway count in visible text, marks north (on a network
// without a gateway) and west (demoted, with the reason as its tooltip),
// and the legend counts the members of each network.
func checkNetworks(t *testing.T, ctx context.Context, id string) {
	t.Helper()
	type shown struct{ Net, Gateways string }
	for member, want := range map[string]shown{
		"primary": {"net-central", "⇄ 1 gateway"}, "west": {"net-west", "⇄ 1 gateway"},
		"east": {"net-east", "⇄ 1 gw · ! no gRPC"}, "north": {"net-dark", "! no gateway"},
	} {
		got := chromium.Eval[shown](t, ctx, fmt.Sprintf(`(() => {
			const g = document.querySelector('svg#%s g.member[data-cluster=%q]');
			const visible = el => el && el.getBoundingClientRect().width > 0 ? el.textContent : "";
			return {Net: visible(g.querySelector(".net-name")), Gateways: visible(g.querySelector(".gw"))};
		})()`, id, member))
		if got != want {
			t.Errorf("%s: %s shows %+v; want %+v", id, member, got, want)
		}
	}
	if !chromium.Eval[bool](t, ctx, fmt.Sprintf(`!!document.querySelector('svg#%s g.member.no-gateway[data-cluster="north"] .gw-none')`, id)) {
		t.Errorf("%s: north, on a network without a gateway, is not marked", id)
	}
	if got := chromium.Eval[string](t, ctx, fmt.Sprintf(`document.querySelector('svg#%s g.member[data-cluster="west"] .demoted-tag title').textContent`, id)); !strings.HasPrefix(got, "Demoted: the member is Stale") {
		t.Errorf("%s: west's demoted tag says %q", id, got)
	}
	if got := chromium.Eval[string](t, ctx, `[...document.querySelectorAll("ul.fed-networks li.network")].map(li => li.dataset.network + ":" + li.dataset.members).join(" ")`); got != "net-central:1 net-dark:1 net-east:1 net-west:1" {
		t.Errorf("the legend of networks says %q", got)
	}
}

// checkTextInCards fails if a text of a member drawn as a card or a row in
// svg#id overflows its card (the demoted tag sits astride the card's edge)
// or runs into its demoted tag.
func checkTextInCards(t *testing.T, ctx context.Context, id string) {
	t.Helper()
	out := chromium.Eval[[]string](t, ctx, fmt.Sprintf(`(() => {
		const out = [];
		for (const g of document.querySelectorAll("svg#%s g.member")) {
			const card = g.querySelector("rect.card");
			if (!card) { continue; }
			const c = card.getBoundingClientRect();
			const pill = g.querySelector(".demoted-pill");
			const p = pill ? pill.getBoundingClientRect() : null;
			for (const tx of g.querySelectorAll("text")) {
				if (tx.closest(".demoted-tag")) { continue; }
				const r = tx.getBoundingClientRect();
				if (r.left < c.left || r.right > c.right || r.top < c.top || r.bottom > c.bottom) {
					out.push(g.dataset.cluster + ": " + tx.textContent);
				}
				if (p && r.left < p.right && p.left < r.right && r.top < p.bottom && p.top < r.bottom) {
					out.push(g.dataset.cluster + " (on its demoted tag): " + tx.textContent);
				}
			}
		}
		return out;
	})()`, id))
	if len(out) > 0 {
		t.Errorf("%s: texts overflow their card: %q", id, out)
	}
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
