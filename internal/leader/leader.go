// Package leader elects one hub replica, through a Lease in the home
// cluster, to do the writes that must happen once (Events, persisted peer
// bundles, our root's sequence). Every replica serves xDS either way.
package leader

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaseName is the Lease the replicas of one hub compete for.
const LeaseName = "hub-leader"

// Timing of the election: a leader that stops renewing is replaced within
// LeaseDuration (plus one RetryPeriod).
const (
	LeaseDuration = 15 * time.Second
	RenewDeadline = 10 * time.Second
	RetryPeriod   = 2 * time.Second
)

// Elector takes part in the election until its context ends.
type Elector struct {
	identity string
	log      *slog.Logger
	lock     resourcelock.Interface
	leading  atomic.Bool
	gauge    prometheus.Gauge

	mu        sync.Mutex
	onLeading []func(context.Context)
}

// New creates an Elector for identity (unique per replica, e.g. the pod
// name) over the Lease in namespace of the home cluster.
func New(client kubernetes.Interface, namespace, identity string, log *slog.Logger) *Elector {
	e := &Elector{
		identity: identity,
		log:      log,
		gauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hub_leader", Help: "1 when this replica holds the hub-leader Lease and does the singleton writes.",
		}),
	}
	e.lock = &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: LeaseName},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
	}
	return e
}

// Collector is the hub_leader gauge.
func (e *Elector) Collector() prometheus.Collector { return e.gauge }

// IsLeader reports whether this replica holds the Lease right now.
func (e *Elector) IsLeader() bool { return e.leading.Load() }

// OnStartedLeading registers fn to run (in its own goroutine, with a
// context that ends when leadership does) each time this replica becomes
// the leader. Register before Run.
func (e *Elector) OnStartedLeading(fn func(context.Context)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.onLeading = append(e.onLeading, fn)
}

// Run campaigns until ctx ends, again after every lost term. On a clean
// stop the Lease is released, so another replica takes over at once.
func (e *Elector) Run(ctx context.Context) error {
	e.mu.Lock()
	hooks := slices.Clone(e.onLeading)
	e.mu.Unlock()
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            e.lock,
		LeaseDuration:   LeaseDuration,
		RenewDeadline:   RenewDeadline,
		RetryPeriod:     RetryPeriod,
		ReleaseOnCancel: true,
		Name:            LeaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				e.leading.Store(true)
				e.gauge.Set(1)
				e.log.Info("leading: this replica does the singleton writes", "identity", e.identity)
				var wg sync.WaitGroup
				for _, fn := range hooks {
					wg.Go(func() { fn(ctx) })
				}
				wg.Wait()
			},
			OnStoppedLeading: func() {
				e.leading.Store(false)
				e.gauge.Set(0)
				e.log.Info("not leading", "identity", e.identity)
			},
			OnNewLeader: func(id string) {
				if id != e.identity {
					e.log.Info("leader elected", "leader", id, "identity", e.identity)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	for ctx.Err() == nil {
		le.Run(ctx) // returns when leadership is lost or ctx ends
	}
	return nil
}
