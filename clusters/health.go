package clusters

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// memberHealth is where a member's client stands — its state, its last
// sync and error, what it published — and who is told when the state it
// shows changes. Each Cluster has one; its methods are safe for concurrent
// use, and the state changes only through them.
//
//	Pending → Syncing → Ready ⇄ Stale
//	            ↓ ↑
//	        Unreachable → TimedOut → Ready
//
// and Invalid from any of them when the member holds more objects than it
// may (overflow: its informers stop until its Secret changes, which makes
// a new client).
type memberHealth struct {
	// timeout is how long the member may take to sync before it is
	// TimedOut (and still waited for).
	timeout time.Duration

	// observeMu orders state changes and their observation (transition).
	observeMu sync.Mutex
	mu        sync.Mutex
	// observe is told the state shown before each change of it, outside mu.
	observe func(from State)

	state        State
	message      string
	lastSync     time.Time
	syncDuration time.Duration
	everSynced   bool
	// informersSynced is set once the informers have synced, before the
	// first publish (and before a new kubeconfig's client is promoted):
	// from then on the member may assert identities (IdentityScope).
	informersSynced bool
	lastErr         string
	// published counts, per Service, the endpoints handed to the Sink.
	published map[ServiceKey]endpointCounts
	// persistedAt is when the view it serves until its first sync was
	// persisted (zero: it was not restored; see persist.go).
	persistedAt time.Time
}

func newMemberHealth(timeout time.Duration) *memberHealth {
	return &memberHealth{timeout: timeout, state: StatePending, published: map[ServiceKey]endpointCounts{}}
}

// transition applies a change to the state under the lock and tells the
// observer if the state shown changed.
func (h *memberHealth) transition(change func()) {
	// One change at a time through to the observer, so that the last state
	// it is told is the member's (the index demotes members by it).
	h.observeMu.Lock()
	defer h.observeMu.Unlock()
	h.mu.Lock()
	from, _ := h.shownLocked()
	change()
	to, _ := h.shownLocked()
	observe := h.observe
	h.mu.Unlock()
	if from != to && observe != nil {
		observe(from)
	}
}

// setObserver replaces the state-change hook.
func (h *memberHealth) setObserver(fn func(from State)) {
	h.mu.Lock()
	h.observe = fn
	h.mu.Unlock()
}

// syncing marks the start of the informers' sync.
func (h *memberHealth) syncing() {
	h.transition(func() {
		h.state, h.message = StateSyncing, "waiting for Services, EndpointSlices and Nodes to sync"
	})
}

// synced marks the member Ready after a sync that took took (unless it is
// Invalid).
func (h *memberHealth) synced(took time.Duration) {
	h.transition(func() {
		if h.state != StateInvalid {
			h.state, h.message, h.lastSync, h.syncDuration, h.everSynced = StateReady, "", time.Now(), took, true
		}
	})
}

// setInformersSynced records that the informers have synced.
func (h *memberHealth) setInformersSynced() {
	h.mu.Lock()
	h.informersSynced = true
	h.mu.Unlock()
}

func (h *memberHealth) syncTimedOut() {
	h.transition(func() {
		if h.state == StateSyncing || h.state == StateUnreachable {
			h.state, h.message = StateTimedOut, h.timedOutMessageLocked()
		}
	})
}

func (h *memberHealth) timedOutMessageLocked() string {
	msg := fmt.Sprintf("not synced within %s; still trying (no longer blocks readiness)", h.timeout)
	if h.lastErr != "" {
		msg += ": cannot list or watch: " + h.lastErr
	}
	return msg
}

// invalid makes the member Invalid for good, saying why.
func (h *memberHealth) invalid(why string) {
	h.transition(func() { h.state, h.message = StateInvalid, why })
}

// requestFailed is called when a request to the member's API server fails.
// A member that was synced goes Stale and keeps serving what it had; one
// that never synced is Unreachable. The next successful request brings it
// back.
func (h *memberHealth) requestFailed(err error) {
	h.transition(func() {
		h.lastErr = err.Error()
		switch h.state {
		case StateReady, StateStale:
			h.state = StateStale
			h.message = "API server unreachable or watch failing; serving the last known endpoints: " + h.lastErr
		case StatePending, StateSyncing, StateUnreachable:
			h.state = StateUnreachable
			h.message = "cannot list or watch: " + h.lastErr
		case StateTimedOut:
			h.message = h.timedOutMessageLocked()
		}
	})
}

// requestSucceeded brings a Stale member back to Ready (and an Unreachable
// one back to Syncing) once its API server answers again.
func (h *memberHealth) requestSucceeded() {
	h.mu.Lock()
	healthy := h.state != StateStale && h.state != StateUnreachable
	h.mu.Unlock()
	if healthy {
		return
	}
	h.transition(func() {
		switch h.state {
		case StateStale:
			h.state, h.message, h.lastErr = StateReady, "", ""
		case StateUnreachable:
			h.state, h.message = StateSyncing, "API server reachable again; waiting for informers to sync"
		}
	})
}

// shownLocked is the state and message the member reports: until a member
// served from its persisted view first syncs, it is Stale, and the message
// says which view it serves. h.mu must be held.
func (h *memberHealth) shownLocked() (State, string) {
	if h.persistedAt.IsZero() || h.everSynced {
		return h.state, h.message
	}
	msg := fmt.Sprintf("serving the view persisted at %s until the member syncs", h.persistedAt.UTC().Format(time.RFC3339))
	if h.message != "" {
		msg += "; " + string(h.state) + ": " + h.message
	}
	return StateStale, msg
}

// holdsReadiness reports whether a member served from its persisted view
// should still keep the hub unready: only while its API server answers and
// it syncs within the timeout, as any member does. Once a request to it
// failed the persisted view is the best there is, and it stops blocking
// (also if the API server answers again, so readiness does not flap).
func (h *memberHealth) holdsReadiness() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.persistedAt.IsZero() && !h.everSynced && h.lastErr == "" &&
		(h.state == StatePending || h.state == StateSyncing)
}

// endpointCounts are a Service view's endpoints, and those of them that do
// not accept Istio mTLS (an east-west gateway routes on its SNI: it cannot
// take them).
type endpointCounts struct{ all, plaintext int }

// countEndpoints counts a Service view's endpoints.
func countEndpoints(v *Service) endpointCounts {
	n := endpointCounts{all: len(v.Endpoints)}
	for _, e := range v.Endpoints {
		if !e.MTLS {
			n.plaintext++
		}
	}
	return n
}

// servePersisted marks a member that has not started yet as serving a view
// persisted at at (a state change to Stale, observed like any other).
func (h *memberHealth) servePersisted(at time.Time, services []*Service) {
	h.transition(func() {
		h.persistedAt = at
		for _, s := range services {
			h.published[ServiceKey{Namespace: s.Namespace, Name: s.Name}] = countEndpoints(s)
		}
	})
}

// publishedOne records what the Sink was handed for one Service (nil:
// none).
func (h *memberHealth) publishedOne(key ServiceKey, view *Service) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if view == nil {
		delete(h.published, key)
	} else {
		h.published[key] = countEndpoints(view)
	}
	h.lastSync = time.Now()
}

// publishedAll records what the Sink was handed for the member as a whole
// (none: it was withdrawn).
func (h *memberHealth) publishedAll(views []*Service) {
	published := make(map[ServiceKey]endpointCounts, len(views))
	for _, v := range views {
		published[ServiceKey{Namespace: v.Namespace, Name: v.Name}] = countEndpoints(v)
	}
	h.mu.Lock()
	h.published = published
	h.mu.Unlock()
}

// healthView is what a member's status shows of its health.
type healthView struct {
	state        State
	message      string
	services     int
	endpoints    endpointCounts // over every Service
	lastSync     time.Time
	syncDuration time.Duration
}

// view is the member's health as its status shows it.
func (h *memberHealth) view() healthView {
	h.mu.Lock()
	defer h.mu.Unlock()
	v := healthView{services: len(h.published), lastSync: h.lastSync, syncDuration: h.syncDuration}
	v.state, v.message = h.shownLocked()
	for _, n := range h.published {
		v.endpoints.all += n.all
		v.endpoints.plaintext += n.plaintext
	}
	return v
}

// identity reports whether the informers have synced (the member may
// assert identities), and the state shown.
func (h *memberHealth) identity() (informersSynced bool, shown State) {
	h.mu.Lock()
	defer h.mu.Unlock()
	shown, _ = h.shownLocked()
	return h.informersSynced, shown
}

// progress reports whether the informers have synced, and whether the
// member was restored from a persisted view.
func (h *memberHealth) progress() (informersSynced, servingPersisted bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.informersSynced, !h.persistedAt.IsZero()
}

// observingTransport reports the outcome of every request a member's client
// makes, so that the state follows what the informers actually experience:
// client-go's reflectors retry refused connections forever without calling
// their watch error handler, so that handler alone never sees an outage.
type observingTransport struct {
	next   http.RoundTripper
	health *memberHealth
}

func (t *observingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	switch {
	case strings.HasSuffix(req.URL.Path, "/secrets"), strings.HasSuffix(req.URL.Path, "/pods"), req.Context().Value(optionalKey{}) != nil:
		// The secret controller, the mesh-pod lookup and the gateway
		// Services written into the member are optional (its credentials
		// may not read Secrets or pods, nor write Services); their failures
		// do not make the member Stale.
	case req.Context().Err() != nil:
		// Cancelled by us (stopping, or a watch ending): says nothing about the server.
	case err != nil:
		t.health.requestFailed(fmt.Errorf("%s %s: %w", req.Method, req.URL.Host, err))
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		t.health.requestFailed(fmt.Errorf("%s %s%s: %s", req.Method, req.URL.Host, req.URL.Path, resp.Status))
	case resp.StatusCode < 300:
		t.health.requestSucceeded()
	}
	return resp, err
}

func (t *observingTransport) WrappedRoundTripper() http.RoundTripper { return t.next }
