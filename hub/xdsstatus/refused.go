package xdsstatus

import (
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"

	"github.com/hubmesh/hub/hub/internal/clip"
)

// Refused is an xDS stream the hub ended because of what its client
// sent (a node over the limits, a credential it does not accept, a type an
// anonymous stream may not read, ...): what an operator needs to tell the
// client's owner, with the gRPC status the client saw.
type Refused struct {
	At       time.Time
	ID       string // the node ID as sent, clipped
	Address  string // peer address
	Identity string // verified SPIFFE ID, if any
	Code     string // gRPC status code, e.g. InvalidArgument
	Message  string // the status message the client got, clipped
}

// maxRefusedKept bounds the refusals the hub remembers (the most recent).
const maxRefusedKept = 64

// Refusals remembers the most recent refused streams and counts them by
// status code (a bounded label: gRPC's codes). Safe for concurrent use.
type Refusals struct {
	mu    sync.Mutex
	ring  []Refused
	next  int
	count *prometheus.CounterVec
}

// NewRefusals makes an empty record.
func NewRefusals() *Refusals {
	return &Refusals{count: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hub_xds_refused_streams_total",
		Help: "xDS streams the hub ended because of what their client sent, by gRPC status code (the most recent are listed at /api/v1/proxies/refused).",
	}, []string{"code"})}
}

// Record notes that a stream was refused with err; node is what its
// client sent last (nil: none yet).
func (r *Refusals) Record(st Proxy, node *corev3.Node, err error) {
	s := status.Convert(err)
	id := st.ID
	if id == "" {
		id = node.GetId()
	}
	rs := Refused{At: time.Now(), ID: clip.String(id, 256), Address: st.Address, Identity: st.Identity,
		Code: s.Code().String(), Message: clip.String(s.Message(), 512)}
	r.count.WithLabelValues(rs.Code).Inc()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ring) < maxRefusedKept {
		r.ring = append(r.ring, rs)
		return
	}
	r.ring[r.next] = rs
	r.next = (r.next + 1) % maxRefusedKept
}

// List returns the remembered refusals, newest first.
func (r *Refusals) List() []Refused {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Refused, 0, len(r.ring))
	for i := range r.ring {
		out = append(out, r.ring[(r.next+len(r.ring)-1-i)%len(r.ring)])
	}
	return out
}

// Collector is the refusals' counter, by code.
func (r *Refusals) Collector() prometheus.Collector { return r.count }
