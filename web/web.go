// Package web is the hub's dashboard: server-rendered HTML from embedded
// templates, a little vanilla JavaScript and Server-Sent Events for live
// updates; and the admin HTTP(S) server (Server) that cmd/hub serves it on,
// next to the REST API of package api. The dashboard reads the same read
// models as the API, through the same interfaces, and its forms call the
// same registration logic; it does not serve the API itself.
package web

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/hubmesh/hub/api"
	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/distribute"
	"github.com/hubmesh/hub/hub/xdsstatus"
	"github.com/hubmesh/hub/trust"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Pushes is the optional push-rate source for the overview chart.
type Pushes interface {
	PushesPerSecond() []int
}

// PushLatency is the optional source of the overview's push latency
// percentiles (*hub.Hub implements it).
type PushLatency interface {
	PushLatency() xdsstatus.Latency
}

// latencyView is push latency as the overview shows it.
type latencyView struct {
	Count    int    // pushed responses measured
	P50, P99 string // over the last five minutes
}

func toLatencyView(s xdsstatus.Latency) latencyView {
	return latencyView{Count: s.Count, P50: formatLatency(s.P50), P99: formatLatency(s.P99)}
}

// formatLatency shows a latency with about three significant digits.
func formatLatency(d time.Duration) string {
	switch {
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
}

// TrustDomains is the read model of SPIFFE federation the trust page shows
// (*trust.Domains implements it).
type TrustDomains interface {
	TrustDomains() []trust.Status
}

// Config holds the dashboard's dependencies: the read models it shows and
// the registrar its forms write through (the REST API's interfaces), and
// the authenticator that signs users in with their API tokens.
type Config struct {
	Membership api.Membership
	Registrar  api.Registrar
	// Serving may also implement Pushes and PushLatency for the
	// overview (*hub.Hub does).
	Serving api.Serving
	// Trust, if set, feeds the trust page.
	Trust TrustDomains
	// Distribution, if set, feeds the distribution page.
	Distribution api.Distribution
	// CA, if set, adds the workload certificates the hub's CA issued and
	// refused to the trust page.
	CA api.CertificateAuthority
	// Auth checks the API tokens users sign in with; nil refuses every
	// sign-in.
	Auth api.Authenticator
	Log  *slog.Logger
	// Refresh is how often live pages check for changes and re-check their
	// session (default 1s, at most 5s).
	Refresh time.Duration
	// SessionTTL is how long a sign-in lasts (default 12h).
	SessionTTL time.Duration
	// Heartbeat is how often an idle live stream sends a comment, so that
	// proxies keep it open and a vanished browser is noticed (default 15s).
	Heartbeat time.Duration
	// Now is the clock of session expiry (default time.Now).
	Now func() time.Time
	// MaxLiveStreamsPerSession bounds the live streams (open tabs) of one
	// session; a newer one displaces the oldest (default
	// DefaultMaxLiveStreamsPerSession).
	MaxLiveStreamsPerSession int
	// MaxLiveStreams bounds the live streams of all sessions; more are
	// refused with 503 (default DefaultMaxLiveStreams).
	MaxLiveStreams int
}

const (
	sessionCookie = "hub_session"
	maxRefresh    = 5 * time.Second
)

// Dashboard is the dashboard's HTTP handler: its pages, forms, live
// stream and static files, each response with the dashboard's security
// headers and every state-changing request checked to come from the
// dashboard's own pages. It serves every path it is given; cmd/hub routes
// it all the paths the REST API does not have.
type Dashboard struct {
	cfg      Config
	handler  http.Handler
	sessions *sessionStore
	live     *liveStreams
	tmpl     *template.Template
	stop     chan struct{} // closed by Shutdown: live streams end
	stopOnce sync.Once
}

// New builds the dashboard.
func New(cfg Config) *Dashboard {
	if cfg.Refresh <= 0 {
		cfg.Refresh = time.Second
	}
	cfg.Refresh = min(cfg.Refresh, maxRefresh)
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 12 * time.Hour
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 15 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.MaxLiveStreamsPerSession <= 0 {
		cfg.MaxLiveStreamsPerSession = DefaultMaxLiveStreamsPerSession
	}
	if cfg.MaxLiveStreams <= 0 {
		cfg.MaxLiveStreams = DefaultMaxLiveStreams
	}
	d := &Dashboard{
		cfg:      cfg,
		sessions: newSessionStore(cfg.Now),
		live:     newLiveStreams(cfg.MaxLiveStreamsPerSession, cfg.MaxLiveStreams),
		tmpl:     template.Must(template.New("").Funcs(funcs).Funcs(pictureFuncs).ParseFS(templateFS, "templates/*.html")),
		stop:     make(chan struct{}),
	}
	r := chi.NewRouter()
	static, _ := fs.Sub(staticFS, "static")
	r.Handle("/static/*", http.StripPrefix("/static/", http.FileServer(http.FS(static))))
	r.Get("/signin", d.signinPage)
	r.Post("/signin", d.signin)
	r.Post("/signout", d.signout) // needs no re-check: signing out always works
	r.Group(func(r chi.Router) {
		r.Use(d.requireSession)
		r.Get("/", d.page("overview"))
		r.Get("/clusters", d.page("clusters"))
		r.Post("/clusters", d.registerCluster)
		r.Get("/clusters/{id}", d.page("cluster"))
		r.Post("/clusters/{id}/remove", d.removeCluster)
		r.Get("/services", d.page("services"))
		r.Get("/proxies", d.page("proxies"))
		r.Get("/proxies/{id}", d.page("proxy"))
		r.Get("/trust", d.page("trust"))
		r.Get("/distribution", d.page("distribution"))
		r.Get("/events", d.events)
	})
	d.handler = securityHeaders(pageCSP, crossOriginProtection(r))
	return d
}

// ServeHTTP implements http.Handler.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) { d.handler.ServeHTTP(w, r) }

// Shutdown ends every live stream, at once and for good: give it to the
// server's shutdown (Server.RegisterOnShutdown), as http.Server.Shutdown
// does not end them otherwise (they never become idle).
func (d *Dashboard) Shutdown() { d.stopOnce.Do(func() { close(d.stop) }) }

// crossOriginProtection refuses the dashboard's state-changing requests
// (POST: sign-in, sign-out and the forms) when a browser says they come from
// another site (Sec-Fetch-Site, or Origin where that is missing). The CSRF
// token covers the forms of a session; this also covers sign-in, which has
// no session yet: another site's page could otherwise sign a browser into
// the attacker's session (login CSRF). Requests without either header (not
// from a browser) pass. The REST API (bearer tokens, no cookies) is not
// behind it: it is routed beside the dashboard, not through it.
func crossOriginProtection(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "cross-site request refused; use the dashboard's own pages", http.StatusForbidden)
	}))
	return cop.Handler(next)
}

// pageCSP lets the dashboard's pages load only their own scripts, styles
// and images (no inline script, no third parties), be framed nowhere and
// submit forms only to the hub.
const pageCSP = "default-src 'self'; style-src 'self'; script-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'"

// securityHeaders sets csp, nosniff and no referrer on every response.
func securityHeaders(csp string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", csp)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		next.ServeHTTP(w, r)
	})
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

type ctxKey struct{}

// errSessionEnded means a session's token is no longer valid or may no
// longer read the hub's state: the session is over.
var errSessionEnded = errors.New("session ended")

// recheck authenticates a session's token again and checks that it may
// still read. The authenticator caches its answers for at most a minute
// (api.KubeAuth; static token files are re-read within a second), so a
// revoked token or a removed permission ends the session within that time.
// It returns errSessionEnded (wrapped) when the session is over, another
// error when the answer cannot be had right now.
func (d *Dashboard) recheck(ctx context.Context, s *session) (api.User, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	u, err := d.cfg.Auth.Authenticate(ctx, s.token)
	switch {
	case errors.Is(err, api.ErrUnauthenticated):
		return api.User{}, fmt.Errorf("%w: the token is no longer valid", errSessionEnded)
	case err != nil:
		return api.User{}, fmt.Errorf("authenticating the session's token: %w", err)
	}
	err = d.cfg.Auth.Authorize(ctx, u, api.Read)
	switch {
	case errors.Is(err, api.ErrForbidden):
		return api.User{}, fmt.Errorf("%w: the token may no longer read the hub's state", errSessionEnded)
	case err != nil:
		return api.User{}, fmt.Errorf("authorising the session's token: %w", err)
	}
	return u, nil
}

// requireSession lets a request through only with a live session whose
// token still authenticates and may still read (see recheck).
func (d *Dashboard) requireSession(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := r.Cookie(sessionCookie)
		var s *session
		if err == nil {
			s = d.sessions.get(c.Value)
		}
		if s != nil {
			u, err := d.recheck(r.Context(), s)
			switch {
			case errors.Is(err, errSessionEnded):
				d.cfg.Log.Info("dashboard session ended", "user", s.user.Name, "reason", err)
				d.sessions.remove(s.id, endRevoked)
				s = nil
			case err != nil:
				d.cfg.Log.Error("re-checking a dashboard session", "user", s.user.Name, "error", err)
				http.Error(w, "cannot verify your session right now; try again shortly", http.StatusServiceUnavailable)
				return
			default:
				cur := *s // this request acts as the user the token maps to now
				cur.user = u
				s = &cur
			}
		}
		if s == nil {
			if r.Method == http.MethodGet && r.URL.Path != "/events" {
				http.Redirect(w, r, "/signin?next="+url.QueryEscape(r.URL.Path), http.StatusSeeOther)
				return
			}
			http.Error(w, "sign in first", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost && !checkCSRF(w, r, s) {
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, s)))
	})
}

// maxForm bounds the body of a dashboard form (a kubeconfig fits easily).
const maxForm = 1 << 20

// parseForm reads a form's body of at most limit bytes, answering 413 if it
// is larger and 400 if it is not a form.
func parseForm(w http.ResponseWriter, r *http.Request, limit int64) bool {
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	if err := r.ParseForm(); err != nil {
		if tooBig := (*http.MaxBytesError)(nil); errors.As(err, &tooBig) {
			http.Error(w, fmt.Sprintf("the form exceeds %d bytes", limit), http.StatusRequestEntityTooLarge)
			return false
		}
		http.Error(w, "the request body is not a valid form", http.StatusBadRequest)
		return false
	}
	return true
}

// checkCSRF reads a form (see parseForm) and checks its CSRF token,
// answering 403 if it does not match the session's.
func checkCSRF(w http.ResponseWriter, r *http.Request, s *session) bool {
	if !parseForm(w, r, maxForm) {
		return false
	}
	if got := r.PostFormValue("csrf"); subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) != 1 {
		http.Error(w, "invalid or missing CSRF token; reload the page", http.StatusForbidden)
		return false
	}
	return true
}

func sessionOf(r *http.Request) *session { s, _ := r.Context().Value(ctxKey{}).(*session); return s }

func (d *Dashboard) signinPage(w http.ResponseWriter, r *http.Request) {
	d.render(w, http.StatusOK, "signin", map[string]any{"Next": safeNext(r.URL.Query().Get("next"))})
}

// safeNext keeps redirects on this site: a path, no scheme or host, no
// control characters (browsers drop tabs and newlines, turning "/\t/x" into
// "//x"), no backslashes.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\") {
		return "/"
	}
	for _, c := range []byte(next) {
		if c < 0x20 || c == 0x7f {
			return "/"
		}
	}
	if u, err := url.Parse(next); err != nil || u.Scheme != "" || u.Host != "" {
		return "/"
	}
	return next
}

func (d *Dashboard) signin(w http.ResponseWriter, r *http.Request) {
	if !parseForm(w, r, 64<<10) {
		return
	}
	token := strings.TrimSpace(r.PostFormValue("token"))
	next := safeNext(r.PostFormValue("next"))
	fail := func(status int, msg string) {
		d.render(w, status, "signin", map[string]any{"Next": next, "Error": msg})
	}
	if token == "" || d.cfg.Auth == nil {
		fail(http.StatusUnauthorized, "Enter an API token.")
		return
	}
	user, err := d.cfg.Auth.Authenticate(r.Context(), token)
	if err == nil {
		err = d.cfg.Auth.Authorize(r.Context(), user, api.Read)
	}
	switch {
	case errors.Is(err, api.ErrUnauthenticated):
		fail(http.StatusUnauthorized, "That token is not valid.")
		return
	case errors.Is(err, api.ErrForbidden):
		fail(http.StatusForbidden, "That token may not read the hub's state.")
		return
	case err != nil:
		d.cfg.Log.Error("checking a dashboard sign-in", "error", err)
		fail(http.StatusServiceUnavailable, "Cannot check tokens right now; try again shortly.")
		return
	}
	id := randomToken()
	d.sessions.add(&session{id: id, user: user, csrf: randomToken(), token: token,
		expires: d.cfg.Now().Add(d.cfg.SessionTTL), ended: make(chan struct{})})
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: id, Path: "/", HttpOnly: true, Secure: r.TLS != nil,
		SameSite: http.SameSiteStrictMode, MaxAge: int(d.cfg.SessionTTL.Seconds()),
	})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// signout ends the session (with its CSRF token) and clears the cookie. It
// does not re-check the session's token, so it works while the home cluster
// cannot be reached; live streams of the session end at once.
func (d *Dashboard) signout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(sessionCookie); err == nil {
		if s := d.sessions.get(c.Value); s != nil {
			if !checkCSRF(w, r, s) {
				return
			}
			d.sessions.remove(s.id, endSignedOut)
		}
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/signin", http.StatusSeeOther)
}

// page renders one of the live pages.
func (d *Dashboard) page(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		data, status := d.data(r, name, chi.URLParam(r, "id"))
		d.render(w, status, name, data)
	}
}

func (d *Dashboard) render(w http.ResponseWriter, status int, name string, data map[string]any) {
	var buf bytes.Buffer
	if err := d.tmpl.ExecuteTemplate(&buf, name, data); err != nil {
		d.cfg.Log.Error("rendering dashboard page", "page", name, "error", err)
		http.Error(w, "rendering failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// data gathers what a page shows. It never includes credentials: clusters
// are shown through api.Cluster, which has only the server URL.
func (d *Dashboard) data(r *http.Request, page, id string) (map[string]any, int) {
	s := sessionOf(r)
	if unescaped, err := url.PathUnescape(id); err == nil {
		id = unescaped
	}
	m := map[string]any{"Page": page, "User": s.user.Name, "CSRF": s.csrf, "ID": id}
	a := d.cfg
	status := http.StatusOK
	switch page {
	case "overview":
		d.overview(m)
	case "clusters":
		m["Clusters"] = toClusters(a.Membership.Clusters())
	case "cluster":
		st, ok := a.Membership.Cluster(id)
		if !ok {
			status = http.StatusNotFound
		}
		c := api.ToCluster(st)
		if ex, isEx := a.Serving.(api.Exchange); ok && isEx {
			e := api.ToExchange(ex.Exchange(id))
			c.Exchange = &e
		}
		m["Found"], m["Cluster"], m["History"] = ok, c, a.Membership.History(id)
	case "services":
		var out []api.Service
		for _, sv := range a.Serving.Services() {
			out = append(out, api.ToService(sv))
		}
		m["Services"] = out
	case "proxies":
		var out []api.Proxy
		for _, p := range a.Serving.Proxies() {
			out = append(out, api.ToProxy(p))
		}
		m["Proxies"] = out
	case "trust":
		var out []api.TrustDomain
		if a.Trust != nil {
			for _, st := range a.Trust.TrustDomains() {
				out = append(out, api.ToTrustDomain(st))
			}
		}
		m["TrustDomains"] = out
		if a.CA != nil {
			if st, ok := a.CA.Certificates(); ok {
				m["CA"] = api.ToCertificates(st)
			}
		}
	case "distribution":
		if a.Distribution != nil {
			m["Distribution"] = a.Distribution.Status()
		}
	case "proxy":
		cfg, ok := a.Serving.ProxyConfig(id)
		if !ok {
			status = http.StatusNotFound
			m["Found"] = false
			break
		}
		pc, err := api.ToProxyConfig(cfg)
		if err != nil {
			m["Error"] = err.Error()
		}
		pretty, _ := json.MarshalIndent(pc.Resources, "", "  ")
		m["Found"], m["Proxy"], m["Config"] = true, pc.Proxy, string(pretty)
	}
	return m, status
}

// overview adds to m what the overview page shows: the members by state,
// the services, endpoints, proxies and trust domains, the picture, and the
// pushes and their latency when Serving counts them (Pushes, PushLatency).
func (d *Dashboard) overview(m map[string]any) {
	a := d.cfg
	sts := a.Membership.Clusters()
	byState := map[string]int{}
	for _, st := range sts {
		byState[string(st.State)]++
	}
	ready, reason := a.Membership.Ready()
	svcs := a.Serving.Services()
	endpoints := 0
	for _, sv := range svcs {
		for _, n := range sv.Endpoints {
			endpoints += n
		}
	}
	m["Members"] = len(sts)
	m["ByState"] = sortedCounts(byState)
	m["Ready"], m["ReadyReason"] = ready, reason
	m["Services"], m["Endpoints"] = len(svcs), endpoints
	proxies := a.Serving.Proxies()
	m["Proxies"] = len(proxies)
	var tds []trust.Status
	if a.Trust != nil {
		tds = a.Trust.TrustDomains()
	}
	certified := map[string]int{}
	if a.CA != nil {
		if st, ok := a.CA.Certificates(); ok {
			for _, g := range st.Groups {
				certified[g.Member] += g.Valid
			}
		}
	}
	m["Picture"] = layoutPicture(sts, proxies, tds, certified)
	if p, ok := a.Serving.(Pushes); ok {
		per := p.PushesPerSecond()
		total := 0
		for _, n := range per {
			total += n
		}
		m["PushesPerMinute"], m["Chart"] = total, chart(per)
	}
	if l, ok := a.Serving.(PushLatency); ok {
		m["Latency"] = toLatencyView(l.PushLatency())
	}
}

func toClusters(sts []clusters.Status) []api.Cluster {
	out := make([]api.Cluster, 0, len(sts))
	for _, st := range sts {
		out = append(out, api.ToCluster(st))
	}
	return out
}

type count struct {
	Key string
	N   int
}

func sortedCounts(m map[string]int) []count {
	out := make([]count, 0, len(m))
	for k, n := range m {
		out = append(out, count{k, n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// bar is one column of the push chart.
type bar struct {
	X, Y, H int
	N       int
	Ago     int
}

// chart lays out 60 one-second bars in a 300×60 SVG.
func chart(per []int) []bar {
	peak := 1
	for _, n := range per {
		peak = max(peak, n)
	}
	out := make([]bar, len(per))
	for i, n := range per {
		h := n * 56 / peak
		if n > 0 && h == 0 {
			h = 1
		}
		out[i] = bar{X: i * 5, Y: 60 - h, H: h, N: n, Ago: len(per) - 1 - i}
	}
	return out
}

func (d *Dashboard) registerCluster(w http.ResponseWriter, r *http.Request) {
	s := sessionOf(r)
	id := strings.TrimSpace(r.PostFormValue("id"))
	kubeconfig := r.PostFormValue("kubeconfig")
	fail := func(status int, msg string) {
		data, _ := d.data(r, "clusters", "")
		data["FormError"], data["FormID"] = msg, id
		d.render(w, status, "clusters", data)
	}
	if err := d.cfg.Auth.Authorize(r.Context(), s.user, api.Write); errors.Is(err, api.ErrForbidden) {
		fail(http.StatusForbidden, "Your token may not register clusters: "+err.Error())
		return
	} else if err != nil {
		d.cfg.Log.Error("authorising a cluster registration", "user", s.user.Name, "error", err)
		fail(http.StatusServiceUnavailable, "Cannot check your permissions right now; try again shortly.")
		return
	}
	if id == "" || strings.TrimSpace(kubeconfig) == "" {
		fail(http.StatusUnprocessableEntity, "Both a cluster ID and a kubeconfig are required.")
		return
	}
	if _, _, err := api.RegisterCluster(r.Context(), d.cfg.Registrar, d.cfg.Membership, id, []byte(kubeconfig)); err != nil {
		var inv *clusters.InvalidError
		if errors.As(err, &inv) {
			fail(http.StatusUnprocessableEntity, inv.Error())
			return
		}
		fail(http.StatusBadGateway, "The home cluster rejected the change: "+err.Error())
		return
	}
	http.Redirect(w, r, "/clusters/"+url.PathEscape(id), http.StatusSeeOther)
}

func (d *Dashboard) removeCluster(w http.ResponseWriter, r *http.Request) {
	s := sessionOf(r)
	id := chi.URLParam(r, "id")
	if err := d.cfg.Auth.Authorize(r.Context(), s.user, api.Write); errors.Is(err, api.ErrForbidden) {
		http.Error(w, "your token may not remove clusters: "+err.Error(), http.StatusForbidden)
		return
	} else if err != nil {
		d.cfg.Log.Error("authorising a cluster removal", "user", s.user.Name, "error", err)
		http.Error(w, "cannot check your permissions right now; try again shortly", http.StatusServiceUnavailable)
		return
	}
	if err := d.cfg.Registrar.Remove(r.Context(), id); err != nil {
		http.Error(w, err.Error(), http.StatusUnprocessableEntity)
		return
	}
	http.Redirect(w, r, "/clusters", http.StatusSeeOther)
}

var funcs = template.FuncMap{
	"ago": func(t *time.Time) string {
		if t == nil {
			return "never"
		}
		d := time.Since(*t).Round(time.Second)
		if d < time.Second {
			return "just now"
		}
		return d.String() + " ago"
	},
	"stamp": func(t any) string {
		switch t := t.(type) {
		case time.Time:
			return t.UTC().Format("2006-01-02 15:04:05Z")
		case *time.Time:
			if t != nil {
				return t.UTC().Format("2006-01-02 15:04:05Z")
			}
		}
		return "—"
	},
	// credentialName names what a badge is about: a member's credential
	// ("token", "client certificate"), nothing for a certificate.
	"credentialName": func(e any) string {
		if c, ok := e.(api.CredentialExpiry); ok {
			return strings.ReplaceAll(c.Credential, "_", " ")
		}
		return ""
	},
	// hasNotes reports whether any kind has a note (distribute.Note).
	"hasNotes": func(kinds []distribute.KindStatus) bool {
		for _, k := range kinds {
			if len(k.Notes) > 0 {
				return true
			}
		}
		return false
	},
	// expiry shows when a time comes, and how far away it is.
	"expiry": func(t *time.Time) string {
		if t == nil {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z") + " (in " + time.Until(*t).Round(time.Minute).String() + ")"
	},
	"seconds": func(s int64) string { return (time.Duration(s) * time.Second).String() },
	"short": func(s string) string {
		if len(s) > 12 {
			return s[:12] + "…"
		}
		return s
	},
	"lower":  strings.ToLower,
	"escape": url.PathEscape,
	"sum": func(m map[string]int) int {
		n := 0
		for _, v := range m {
			n += v
		}
		return n
	},
}
