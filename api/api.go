// Package api is the hub's REST API (DESIGN.md §3.3) on chi, plus the health,
// readiness and metrics endpoints. It only reads the hub's read models; its
// writes (in later versions) go to Kubernetes, never around it.
package api

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hubmesh/hub/clusters"
)

// Membership is the read model of member clusters.
type Membership interface {
	Clusters() []clusters.Status
	Cluster(id string) (clusters.Status, bool)
	Ready() (bool, string)
}

// Config holds the API's dependencies.
type Config struct {
	Membership Membership
	// Metrics is the registry served at /metrics.
	Metrics *prometheus.Registry
	Log     *slog.Logger
}

// Cluster is the JSON form of a member cluster (DESIGN.md §3.3).
type Cluster struct {
	ID           string     `json:"id"`
	Secret       string     `json:"secret"`
	State        string     `json:"state"`
	Message      string     `json:"message"`
	Server       string     `json:"server"`
	Services     int        `json:"services"`
	Endpoints    int        `json:"endpoints"`
	LastSyncTime *time.Time `json:"lastSyncTime"`
}

// List is the envelope of every list response.
type List[T any] struct {
	Items []T `json:"items"`
}

// Problem is an RFC 9457 problem document.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// NewHandler returns the admin HTTP handler: /healthz, /readyz, /metrics and /api/v1.
func NewHandler(cfg Config) http.Handler {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	s := &server{cfg: cfg}
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { writeText(w, http.StatusOK, "ok") })
	r.Get("/readyz", s.readyz)
	if cfg.Metrics != nil {
		r.Handle("/metrics", promhttp.HandlerFor(cfg.Metrics, promhttp.HandlerOpts{}))
	}
	r.Route("/api/v1", func(r chi.Router) {
		r.Get("/clusters", s.listClusters)
		r.Get("/clusters/{id}", s.getCluster)
	})
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, http.StatusNotFound, "no route for "+r.URL.Path)
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, http.StatusMethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path)
	})
	return r
}

type server struct{ cfg Config }

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
		out.Items = append(out.Items, toCluster(st))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) getCluster(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	st, ok := s.cfg.Membership.Cluster(id)
	if !ok {
		writeProblem(w, http.StatusNotFound, "cluster "+id+" is not registered")
		return
	}
	writeJSON(w, http.StatusOK, toCluster(st))
}

func toCluster(st clusters.Status) Cluster {
	c := Cluster{
		ID: st.ID, Secret: st.Secret, State: string(st.State), Message: st.Message,
		Server: st.Server, Services: st.Services, Endpoints: st.Endpoints,
	}
	if !st.LastSyncTime.IsZero() {
		t := st.LastSyncTime.UTC()
		c.LastSyncTime = &t
	}
	return c
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeText(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(msg + "\n"))
}

func writeProblem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(Problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail})
}
