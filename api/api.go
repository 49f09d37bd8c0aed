// Package api is the hub's REST API (docs/architecture.md §3.3) on chi, plus the health,
// readiness and metrics endpoints. It reads the hub's read models; it
// writes, in the home cluster, remote Secrets (clusters.Registrar: POST and
// DELETE /clusters) and trust-domain federation ConfigMaps (PUT and DELETE
// /trustdomains, and refreshes on POST .../refresh), and sends
// TokenReviews and SubjectAccessReviews to authorise its callers.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"net/url"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/distribute"
	"github.com/hubmesh/hub/hub"
	"github.com/hubmesh/hub/hub/ca"
	"github.com/hubmesh/hub/hub/xdsstatus"
)

// Membership is the read model of member clusters.
type Membership interface {
	Clusters() []clusters.Status
	Cluster(id string) (clusters.Status, bool)
	History(id string) []clusters.Transition
	Ready() (bool, string)
}

// Registrar writes member registrations (remote Secrets).
type Registrar interface {
	Register(ctx context.Context, id string, kubeconfig []byte) (secret string, created bool, err error)
	Remove(ctx context.Context, id string) error
}

// Serving is what the hub serves over xDS, as the API reads it: the
// federated services and the proxies connected to it.
type Serving interface {
	Services() []hub.ServiceSummary
	Proxies() []xdsstatus.Proxy
	ProxyConfig(id string) (xdsstatus.ProxyConfig, bool)
}

// Refusals are the xDS streams the hub recently ended because of what
// their clients sent; Serving may implement it (*hub.Hub does) for GET
// /api/v1/proxies/refused.
type Refusals interface {
	RefusedStreams() []xdsstatus.Refused
}

// Exchange is what a member exports and imports; Serving may implement
// it (*hub.Hub does) for GET /api/v1/clusters/{id}.
type Exchange interface {
	Exchange(member string) hub.MemberExchange
}

// CertificateAuthority is the read model of the hub's CA (Istio's CA API):
// certificates issued per member and namespace, requests refused per
// reason (*hub.Hub implements it; ok is false when it serves no CA).
type CertificateAuthority interface {
	Certificates() (ca.CertificateStats, bool)
}

// Distribution is the state of the Istio objects distributed from the home
// cluster to member istiods (distribute.Source).
type Distribution interface {
	Status() distribute.Status
}

// Config holds the API's dependencies.
type Config struct {
	Membership Membership
	Registrar  Registrar
	Serving    Serving
	// Trust is SPIFFE federation; nil answers its routes with 404.
	Trust Trust
	// Distribution, if set, answers GET /api/v1/distribution.
	Distribution Distribution
	// CA, if set, answers GET /api/v1/certificates.
	CA   CertificateAuthority
	Auth Authenticator
	// Metrics is the registry served at /metrics.
	Metrics *prometheus.Registry
	// OpenMetrics serves /metrics without a token (--metrics-auth=none);
	// otherwise it needs a bearer token with Metrics access, as the API's
	// routes need theirs.
	OpenMetrics bool
	Log         *slog.Logger
}

// maxBody bounds request bodies.
const maxBody = 1 << 20

// NewHandler returns the API's handler alone: /healthz, /readyz, /metrics
// and /api/v1 (cmd/hub uses Mount, to serve the dashboard beside it).
func NewHandler(cfg Config) http.Handler {
	r := chi.NewRouter()
	Mount(r, cfg)
	return r
}

// Mount adds the API's routes to r, so that another handler (the dashboard)
// can serve r's other paths, and a recoverer that answers 500 for a panic
// on any route of r. As it adds middleware, r must have no routes yet.
// Every /api/v1 route authenticates its bearer token itself, and so does
// /metrics unless Config.OpenMetrics.
func Mount(r chi.Router, cfg Config) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	s := &server{cfg: cfg}
	r.Use(middleware.Recoverer)
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { writeText(w, http.StatusOK, "ok") })
	r.Get("/readyz", s.readyz)
	if cfg.Metrics != nil {
		metrics := promhttp.HandlerFor(cfg.Metrics, promhttp.HandlerOpts{})
		if !cfg.OpenMetrics {
			metrics = s.require(Metrics)(metrics)
		}
		r.Handle("/metrics", metrics)
	}
	// Go's runtime profiles (heap, goroutines, CPU) for whoever may change
	// the hub: a CPU profile or trace costs the hub CPU while it runs.
	r.Route("/debug/pprof", func(r chi.Router) {
		r.Use(s.require(Write))
		r.Get("/", pprof.Index)
		r.Get("/profile", pprof.Profile)
		r.Get("/trace", pprof.Trace)
		r.Get("/symbol", pprof.Symbol)
		r.Get("/{profile}", func(w http.ResponseWriter, r *http.Request) {
			pprof.Handler(chi.URLParam(r, "profile")).ServeHTTP(w, r)
		})
	})
	r.Route("/api/v1", func(r chi.Router) {
		r.NotFound(func(w http.ResponseWriter, r *http.Request) {
			WriteProblem(w, http.StatusNotFound, "no route for "+r.URL.Path)
		})
		r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
			WriteProblem(w, http.StatusMethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path)
		})
		r.Group(func(r chi.Router) {
			r.Use(s.require(Read))
			r.Get("/clusters", s.listClusters)
			r.Get("/clusters/{id}", s.getCluster)
			r.Get("/services", s.listServices)
			r.Get("/proxies", s.listProxies)
			r.Get("/proxies/refused", s.listRefused)
			r.Get("/proxies/{id}/config", s.proxyConfig)
			r.Get("/trustdomains", s.listTrustDomains)
			r.Get("/trustdomains/{td}", s.getTrustDomain)
			r.Get("/trustdomains/{td}/bundle", s.trustDomainBundle)
			r.Get("/distribution", s.distribution)
			r.Get("/certificates", s.certificates)
			r.Get("/openapi.json", serveOpenAPI)
		})
		r.Group(func(r chi.Router) {
			r.Use(s.require(Write))
			r.Post("/clusters", s.registerCluster)
			r.Delete("/clusters/{id}", s.removeCluster)
			r.Put("/trustdomains/{td}", s.putTrustDomain)
			r.Delete("/trustdomains/{td}", s.deleteTrustDomain)
			r.Post("/trustdomains/{td}/refresh", s.refreshTrustDomain)
		})
	})
}

type server struct{ cfg Config }

// require authenticates the bearer token and checks the access level.
func (s *server) require(a Access) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || token == "" {
				w.Header().Set("WWW-Authenticate", `Bearer realm="hub"`)
				WriteProblem(w, http.StatusUnauthorized, "a bearer token is required")
				return
			}
			if s.cfg.Auth == nil {
				WriteProblem(w, http.StatusServiceUnavailable, "API authentication is not configured")
				return
			}
			user, err := s.cfg.Auth.Authenticate(r.Context(), token)
			switch {
			case errors.Is(err, ErrUnauthenticated):
				w.Header().Set("WWW-Authenticate", `Bearer realm="hub", error="invalid_token"`)
				WriteProblem(w, http.StatusUnauthorized, "the bearer token is not valid")
				return
			case err != nil:
				s.cfg.Log.Error("authenticating API request", "error", err)
				WriteProblem(w, http.StatusServiceUnavailable, "cannot verify the token right now")
				return
			}
			if err := s.cfg.Auth.Authorize(r.Context(), user, a); err != nil {
				if errors.Is(err, ErrForbidden) {
					WriteProblem(w, http.StatusForbidden, err.Error())
					return
				}
				s.cfg.Log.Error("authorizing API request", "error", err)
				WriteProblem(w, http.StatusServiceUnavailable, "cannot check permissions right now")
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

func (s *server) readyz(w http.ResponseWriter, _ *http.Request) {
	if ok, reason := s.cfg.Membership.Ready(); !ok {
		writeText(w, http.StatusServiceUnavailable, "not ready: "+reason)
		return
	}
	writeText(w, http.StatusOK, "ok")
}

func (s *server) listClusters(w http.ResponseWriter, _ *http.Request) {
	sts := s.cfg.Membership.Clusters()
	out := List[Cluster]{Items: make([]Cluster, 0, len(sts))}
	for _, st := range sts {
		out.Items = append(out.Items, ToCluster(st))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) getCluster(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	st, ok := s.cfg.Membership.Cluster(id)
	if !ok {
		WriteProblem(w, http.StatusNotFound, "cluster "+id+" is not registered")
		return
	}
	out := ToCluster(st)
	if ex, ok := s.cfg.Serving.(Exchange); ok {
		e := ToExchange(ex.Exchange(id))
		out.Exchange = &e
	}
	writeJSON(w, http.StatusOK, out)
}

// RegisterRequest is the body of POST /api/v1/clusters.
type RegisterRequest struct {
	ID         string `json:"id"`
	Kubeconfig string `json:"kubeconfig"`
}

func (s *server) registerCluster(w http.ResponseWriter, r *http.Request) {
	var req RegisterRequest
	if status, err := decodeStrict(w, r, &req); err != nil {
		WriteProblem(w, status, err.Error())
		return
	}
	if req.ID == "" || req.Kubeconfig == "" {
		WriteProblem(w, http.StatusUnprocessableEntity, `both "id" and "kubeconfig" are required`)
		return
	}
	st, created, err := RegisterCluster(r.Context(), s.cfg.Registrar, s.cfg.Membership, req.ID, []byte(req.Kubeconfig))
	if err != nil {
		s.writeError(w, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		w.Header().Set("Location", "/api/v1/clusters/"+url.PathEscape(req.ID))
	}
	writeJSON(w, status, ToCluster(st))
}

// RegisterCluster writes a registration and returns the cluster's status:
// the registry's if it already knows the cluster, else Pending. The
// dashboard's form uses it too.
func RegisterCluster(ctx context.Context, reg Registrar, m Membership, id string, kubeconfig []byte) (clusters.Status, bool, error) {
	secret, created, err := reg.Register(ctx, id, kubeconfig)
	if err != nil {
		return clusters.Status{}, false, err
	}
	st, ok := m.Cluster(id)
	if !ok || st.Secret != secret {
		st = clusters.Status{ID: id, Secret: secret, State: clusters.StatePending, Message: "registered; waiting for the hub to pick up the secret"}
	}
	return st, created, nil
}

func (s *server) removeCluster(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.Registrar.Remove(r.Context(), chi.URLParam(r, "id")); err != nil {
		s.writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) writeError(w http.ResponseWriter, err error) {
	var inv *clusters.InvalidError
	if errors.As(err, &inv) {
		WriteProblem(w, http.StatusUnprocessableEntity, inv.Error())
		return
	}
	s.cfg.Log.Error("API request failed", "error", err)
	WriteProblem(w, http.StatusBadGateway, "the home cluster rejected the change: "+err.Error())
}

// listServices lists the federated services; with ?member=<id>, each says
// whether that member's proxies are routed to it and, where a member's
// view is withheld from them, why.
func (s *server) listServices(w http.ResponseWriter, r *http.Request) {
	member := r.URL.Query().Get("member")
	if member != "" {
		if err := clusters.ValidateClusterID(member); err != nil {
			WriteProblem(w, http.StatusBadRequest, "member: "+err.Error())
			return
		}
	}
	svcs := s.cfg.Serving.Services()
	out := List[Service]{Items: make([]Service, 0, len(svcs))}
	for _, sv := range svcs {
		item := ToService(sv)
		if member != "" {
			item.RoutedFor(member, sv)
		}
		out.Items = append(out.Items, item)
	}
	writeJSON(w, http.StatusOK, out)
}

// certificates shows the workload certificates the hub's CA issued and the
// requests it refused.
func (s *server) certificates(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.CA == nil {
		WriteProblem(w, http.StatusNotFound, "the CA is not served by this hub")
		return
	}
	st, ok := s.cfg.CA.Certificates()
	if !ok {
		WriteProblem(w, http.StatusNotFound, "the CA is not served by this hub")
		return
	}
	writeJSON(w, http.StatusOK, ToCertificates(st))
}

// distribution shows which Istio kinds the home cluster serves and are
// distributed to member istiods, which are missing (no CRD), and which
// objects were left out because their spec does not convert.
func (s *server) distribution(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.Distribution == nil {
		WriteProblem(w, http.StatusNotFound, "Istio object distribution is not configured on this hub")
		return
	}
	writeJSON(w, http.StatusOK, s.cfg.Distribution.Status())
}

func (s *server) listProxies(w http.ResponseWriter, _ *http.Request) {
	ps := s.cfg.Serving.Proxies()
	out := List[Proxy]{Items: make([]Proxy, 0, len(ps))}
	for _, p := range ps {
		out.Items = append(out.Items, ToProxy(p))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) listRefused(w http.ResponseWriter, _ *http.Request) {
	out := List[RefusedStream]{Items: []RefusedStream{}}
	if rf, ok := s.cfg.Serving.(Refusals); ok {
		for _, r := range rf.RefusedStreams() {
			out.Items = append(out.Items, RefusedStream{At: r.At, ID: r.ID, Address: r.Address, Identity: r.Identity, Code: r.Code, Message: r.Message})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) proxyConfig(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	if unescaped, err := url.PathUnescape(id); err == nil {
		id = unescaped
	}
	cfg, ok := s.cfg.Serving.ProxyConfig(id)
	if !ok {
		WriteProblem(w, http.StatusNotFound, "proxy "+id+" is not connected")
		return
	}
	out, err := ToProxyConfig(cfg)
	if err != nil {
		WriteProblem(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// decodeStrict decodes one JSON object, rejecting unknown fields, trailing
// data and bodies over maxBody. It returns the HTTP status for an error.
func decodeStrict(w http.ResponseWriter, r *http.Request, v any) (int, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return http.StatusUnsupportedMediaType, fmt.Errorf("Content-Type must be application/json, not %q", ct)
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		var syntax *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &tooBig):
			return http.StatusRequestEntityTooLarge, fmt.Errorf("request body exceeds %d bytes", maxBody)
		case errors.Is(err, io.EOF):
			return http.StatusBadRequest, errors.New("request body is empty")
		case errors.As(err, &syntax):
			return http.StatusBadRequest, fmt.Errorf("request body is not valid JSON (at byte %d)", syntax.Offset)
		case errors.Is(err, io.ErrUnexpectedEOF):
			return http.StatusBadRequest, errors.New("request body is not valid JSON (it ends too early)")
		case errors.As(err, &typ):
			return http.StatusBadRequest, fmt.Errorf("field %q must be a %s", typ.Field, typ.Type)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			return http.StatusBadRequest, fmt.Errorf("unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
		}
		return http.StatusBadRequest, fmt.Errorf("request body: %v", err)
	}
	if dec.More() {
		return http.StatusBadRequest, errors.New("request body must hold exactly one JSON object")
	}
	return 0, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeText(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(msg + "\n"))
}

// WriteProblem writes an RFC 9457 problem document.
func WriteProblem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(Problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail})
}

// timePtr renders zero times as JSON null.
func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}
