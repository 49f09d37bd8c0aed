// Package chromium drives a real headless Chromium for the dashboard's
// tests (docs/architecture.md §6) through chromedp: one copy of starting the browser,
// running steps with generous deadlines, waiting on the page without
// reloading it, watching it for errors, and saving screenshots.
package chromium

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
)

// Available reports whether chromium is on PATH.
func Available() bool {
	_, err := exec.LookPath("chromium")
	return err == nil
}

// Start starts headless Chromium (1280×800) for the test and stops it when
// the test ends. Without chromium on PATH the test fails in CI and is
// skipped elsewhere, saying so.
func Start(t testing.TB) context.Context {
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
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-quic", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 800))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	if err := chromedp.Do(ctx); err != nil { // start the browser without a timeout
		t.Fatalf("starting chromium: %v", err)
	}
	t.Cleanup(func() { cancel(); cancelAlloc() })
	return ctx
}

// Do runs browser steps within a minute, failing the test with where the
// page was and what it showed.
func Do(t testing.TB, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := chromedp.Do(tctx, steps...); err != nil {
		loc, _ := chromedp.Run(ctx, chromedp.Location())
		body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText.slice(0, 2000) : ""`))
		t.Fatalf("%s: %v\nat %s:\n%s", what, err, loc, body)
	}
}

// Eval evaluates a JavaScript expression in the page.
func Eval[T any](t testing.TB, ctx context.Context, js string) T {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(tctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluating %s: %v", js, err)
	}
	return v
}

// WaitJS waits until the expression is true in the page, without reloading.
func WaitJS(t testing.TB, ctx context.Context, js string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !Eval[bool](t, ctx, "!!("+js+")") {
		if time.Now().After(deadline) {
			t.Fatalf("%s never held within %s", js, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitText waits until the text of the element sel selects contains want,
// without reloading.
func WaitText(t testing.TB, ctx context.Context, sel, want string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		text, err := chromedp.Run(tctx, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%q)||{}).textContent||""`, sel)))
		cancel()
		if err == nil && strings.Contains(text, want) {
			return
		}
		last = text
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s never contained %q (last %q)", sel, want, strings.TrimSpace(last))
}

// PageHTML is the page's current markup.
func PageHTML(t testing.TB, ctx context.Context) string {
	t.Helper()
	return Eval[string](t, ctx, `document.documentElement.outerHTML`)
}

// Artifacts is where a test's screenshots go: $HUB_ARTIFACTS_DIR/<test>,
// else the test's temporary directory.
func Artifacts(t testing.TB) string {
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

// Screenshot saves the whole page as dir/name.png.
func Screenshot(t testing.TB, ctx context.Context, dir, name string) {
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

// PageErrors collects what the page's console reports as an error (a
// Content-Security-Policy violation, say) and uncaught script exceptions.
type PageErrors struct {
	mu   sync.Mutex
	errs []string
}

// WatchErrors starts collecting the page's errors.
func WatchErrors(t testing.TB, ctx context.Context) *PageErrors {
	t.Helper()
	pe := &PageErrors{}
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

// Check fails the test for every error collected since the last Check.
func (pe *PageErrors) Check(t testing.TB) {
	t.Helper()
	pe.mu.Lock()
	defer pe.mu.Unlock()
	for _, e := range pe.errs {
		t.Errorf("the page reported an error: %s", e)
	}
	pe.errs = nil
}
