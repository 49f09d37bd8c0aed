package web

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/hubmesh/hub/clusters"
)

// browser starts headless Chromium for the test (DESIGN.md §6).
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		msg := "chromium not found on PATH (apt-get install -y chromium)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg + " (skipping outside CI; in CI this fails)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 800))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	if err := chromedp.Do(ctx); err != nil { // start the browser without a timeout
		t.Fatalf("starting chromium: %v", err)
	}
	t.Cleanup(func() { cancel(); cancelAlloc() })
	return ctx
}

// artifacts is where screenshots go: HUB_ARTIFACTS_DIR or the test's temp dir.
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("HUB_ARTIFACTS_DIR")
	if dir == "" {
		return t.TempDir()
	}
	dir = filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "-"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// do runs browser steps with a generous deadline, failing the test with
// where the page was.
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, steps...); err != nil {
		body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText.slice(0, 2000) : ""`))
		t.Fatalf("%s: %v\n%s", what, err, body)
	}
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(tctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluating %s: %v", js, err)
	}
	return v
}

// waitJS waits until the expression is true in the page (no reload).
func waitJS(t *testing.T, ctx context.Context, js string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !eval[bool](t, ctx, "!!("+js+")") {
		if time.Now().After(deadline) {
			t.Fatalf("%s never held within %s", js, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pageErrors collects what the page's console reports as an error (a
// Content-Security-Policy violation, say) and uncaught script exceptions.
type pageErrors struct {
	mu   sync.Mutex
	errs []string
}

func watchErrors(t *testing.T, ctx context.Context) *pageErrors {
	t.Helper()
	pe := &pageErrors{}
	err := chromedp.Listen(ctx, func(ev any) {
		var msg string
		switch e := ev.(type) {
		case *cdplog.EventEntryAdded:
			// The dashboard has no favicon; the browser asks anyway.
			if (e.Entry.Level == cdplog.EntryLevelError || strings.Contains(e.Entry.Text, "Content Security Policy")) &&
				!strings.HasSuffix(e.Entry.URL, "/favicon.ico") {
				msg = e.Entry.Text + " " + e.Entry.URL
			}
		case *runtime.EventExceptionThrown:
			msg = e.ExceptionDetails.Text
		}
		if msg != "" {
			pe.mu.Lock()
			pe.errs = append(pe.errs, msg)
			pe.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return pe
}

func (pe *pageErrors) check(t *testing.T) {
	t.Helper()
	pe.mu.Lock()
	defer pe.mu.Unlock()
	for _, e := range pe.errs {
		t.Errorf("the page reported an error: %s", e)
	}
	pe.errs = nil
}

func shot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPictureInChromium: the overview's picture in real Chromium shows each
// member's state, follows a state change live (no reload), and is drawn at
// desktop and phone width with 3 and with 50 members (screenshots).
func TestPictureInChromium(t *testing.T) {
	ctx := browser(t)
	dir := artifacts(t)
	models := federation(3)
	s := startServer(t, models.config(), ServerOptions{}, nil)
	errs := watchErrors(t, ctx)
	do(t, ctx, "sign in", chromedp.Navigate(s.base+"/signin"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SetValue(chromedp.ID("token"), "good"), chromedp.Submit(chromedp.ID("token")),
		chromedp.WaitVisible(chromedp.CSS("svg#federation")))
	waitJS(t, ctx, `document.getElementById("live-status").textContent.includes("Live")`, 30*time.Second)

	for _, id := range []string{"primary", "west", "east", "north"} {
		sel := fmt.Sprintf(`svg#federation g.member[data-cluster=%q][data-state="Ready"]`, id)
		if !eval[bool](t, ctx, fmt.Sprintf(`!!document.querySelector(%q)`, sel)) {
			t.Errorf("no %s in the picture", sel)
		}
	}
	if got := eval[string](t, ctx, `document.querySelector('svg#federation g.proxies[data-cluster="east"]').dataset.count`); got != "2" {
		t.Errorf("east's proxies: data-count %q; want 2", got)
	}
	if !eval[bool](t, ctx, `!!document.querySelector('svg#federation g.subscribers[data-cluster="east"][data-count="1"]')`) {
		t.Errorf("east's istiod is not in the picture")
	}
	if !eval[bool](t, ctx, `!!document.querySelector('svg#federation g.trustdomain[data-trust-domain="partner.example.org"][data-state="Ready"]')`) {
		t.Errorf("the federated trust domain is not in the picture")
	}
	shot(t, ctx, dir, "01-desktop-3-members")
	errs.check(t) // no CSP violation, no script error

	// A member turns Stale in the read model: the picture follows, live.
	eval[int](t, ctx, `window.__noReload = 1`)
	models.setState("west", clusters.StateStale)
	waitJS(t, ctx, `document.querySelector('svg#federation g.member[data-cluster="west"][data-state="Stale"]')`, 30*time.Second)
	if eval[int](t, ctx, `window.__noReload || 0`) != 1 {
		t.Fatal("the page was reloaded; the picture must update live")
	}
	if got := eval[string](t, ctx, `document.querySelector('svg#federation g.member[data-cluster="west"] .sub .state-text').textContent`); got != "Stale" {
		t.Errorf("west's card says %q; want Stale (text, not colour alone)", got)
	}
	shot(t, ctx, dir, "02-desktop-3-members-west-stale")

	do(t, ctx, "phone width", chromedp.EmulateViewport(390, 844), chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("svg#federation-compact")))
	if eval[bool](t, ctx, `getComputedStyle(document.getElementById("federation")).display !== "none"`) {
		t.Errorf("the wide picture is shown at phone width")
	}
	checkFits(t, ctx)
	shot(t, ctx, dir, "03-phone-3-members")

	// 50 members.
	many := federation(50)
	models.mu.Lock()
	models.members, models.proxies, models.tds = many.members, many.proxies, many.tds
	models.mu.Unlock()
	do(t, ctx, "reload with 50 members", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`svg#federation-compact[data-members="51"]`)))
	checkFits(t, ctx)
	shot(t, ctx, dir, "04-phone-50-members")
	do(t, ctx, "desktop with 50 members", chromedp.EmulateViewport(1280, 800), chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`svg#federation[data-members="51"]`)))
	if n := eval[int](t, ctx, `document.querySelectorAll("svg#federation g.member").length`); n != 51 {
		t.Errorf("desktop picture draws %d of 51 members", n)
	}
	checkFits(t, ctx)
	shot(t, ctx, dir, "05-desktop-50-members")

	// A member whose ID is markup arrives live as text: nothing runs.
	evil := `<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'"`
	models.mu.Lock()
	models.members = append(models.members, clusters.Status{ID: evil, Secret: "ns/evil", State: clusters.StateInvalid, Message: evil})
	models.mu.Unlock()
	waitJS(t, ctx, fmt.Sprintf(`[...document.querySelectorAll("svg#federation g.member")].some(g => g.dataset.cluster === %q && g.dataset.state === "Invalid")`, evil), 30*time.Second)
	if v := eval[int](t, ctx, `window.__pwned || 0`); v != 0 {
		t.Errorf("a member's ID ran script (%d)", v)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll("main img, main script").length`); n != 0 {
		t.Errorf("a member's ID made %d elements", n)
	}
	errs.check(t)
	t.Logf("screenshots in %s", dir)
}

// checkFits fails if the page scrolls sideways or the shown picture's text
// is smaller than 10 CSS pixels.
func checkFits(t *testing.T, ctx context.Context) {
	t.Helper()
	if w := eval[int](t, ctx, `document.documentElement.scrollWidth - document.documentElement.clientWidth`); w > 0 {
		t.Errorf("the page scrolls sideways by %d px", w)
	}
	smallest := eval[float64](t, ctx, `(() => {
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
