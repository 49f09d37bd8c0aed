package xdsstatus

import (
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// latencyBuckets are the upper bounds, in seconds, of push latency: from
// 1 ms to 30 s, like istiod's pilot_proxy_convergence_time.
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 30}

const (
	latencySlot   = 10 * time.Second // one ring slot
	latencySlots  = 30               // 5 minutes of slots
	latencyWindow = latencySlot * latencySlots
)

// PushLatency measures how long a change took to reach the streams: from
// the index receiving it (the informer event as delivered to the Sink) to
// a pushed response being handed to a stream. Responses to a stream's own
// request are not measured. It exports a Prometheus histogram and keeps
// the same buckets for the last five minutes, per 10 s slot, for the
// dashboard's percentiles.
type PushLatency struct {
	hist     *prometheus.HistogramVec
	mu       sync.Mutex
	byLabel  map[string]prometheus.Observer // type label → its series, made at its first push
	slotAt   [latencySlots]int64            // which 10 s period a slot counts (unix time / 10 s)
	slotHits [latencySlots][]uint32
}

// NewPushLatency makes an empty measure.
func NewPushLatency() *PushLatency {
	l := &PushLatency{
		hist: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hub_xds_push_latency_seconds",
			Help:    "Time from a member's change reaching the hub's index to a pushed xDS response being handed to a stream, by type; responses to a stream's own request are not counted.",
			Buckets: latencyBuckets,
		}, []string{"type"}),
		byLabel: map[string]prometheus.Observer{},
	}
	for i := range l.slotHits {
		l.slotHits[i] = make([]uint32, len(latencyBuckets)+1) // the last one: above 30 s
	}
	return l
}

// Observe records one pushed response of the type label names: a label
// of a bounded set, never a client's words (the hub's are the short names
// of the types it serves; "" for any other type records nothing, so that a
// client cannot invent series) for a change first seen at
// since. A nil receiver or a zero since records nothing.
func (l *PushLatency) Observe(label string, since time.Time) {
	if l == nil || label == "" || since.IsZero() {
		return
	}
	now := time.Now()
	d := now.Sub(since)
	if d < 0 {
		d = 0
	}
	secs := d.Seconds()
	b := sort.SearchFloat64s(latencyBuckets, secs) // first bound ≥ secs
	period := now.UnixNano() / int64(latencySlot)
	i := period % latencySlots
	l.mu.Lock()
	o := l.byLabel[label]
	if o == nil {
		o = l.hist.WithLabelValues(label)
		l.byLabel[label] = o
	}
	if l.slotAt[i] != period {
		l.slotAt[i] = period
		clear(l.slotHits[i])
	}
	l.slotHits[i][b]++
	l.mu.Unlock()
	o.Observe(secs)
}

// Collector is the latency histogram.
func (l *PushLatency) Collector() prometheus.Collector { return l.hist }

// Latency is push latency over a recent window.
type Latency struct {
	// Window is how far back it looks.
	Window time.Duration
	// Count is how many pushed responses were measured in it.
	Count int
	// P50 and P99 are estimated from histogram buckets (linear within a
	// bucket, as Prometheus's histogram_quantile does); zero when Count is.
	P50, P99 time.Duration
}

// Summary merges the slots of the last five minutes.
func (l *PushLatency) Summary() Latency {
	out := Latency{Window: latencyWindow}
	if l == nil {
		return out
	}
	merged := make([]uint64, len(latencyBuckets)+1)
	now := time.Now().UnixNano() / int64(latencySlot)
	l.mu.Lock()
	for i := range l.slotAt {
		if at := l.slotAt[i]; at > now-latencySlots && at <= now {
			for b, n := range l.slotHits[i] {
				merged[b] += uint64(n)
			}
		}
	}
	l.mu.Unlock()
	var total uint64
	for _, n := range merged {
		total += n
	}
	if total == 0 {
		return out
	}
	out.Count = int(total)
	out.P50, out.P99 = bucketQuantile(merged, total, 0.5), bucketQuantile(merged, total, 0.99)
	return out
}

// bucketQuantile estimates the q-quantile of counts per latencyBuckets
// bucket (the last one unbounded: it reports the highest bound).
func bucketQuantile(counts []uint64, total uint64, q float64) time.Duration {
	rank := q * float64(total)
	var seen float64
	for b, n := range counts {
		if n == 0 || seen+float64(n) < rank {
			seen += float64(n)
			continue
		}
		if b == len(latencyBuckets) {
			break
		}
		lower := 0.0
		if b > 0 {
			lower = latencyBuckets[b-1]
		}
		upper := latencyBuckets[b]
		secs := lower + (upper-lower)*(rank-seen)/float64(n)
		return time.Duration(secs * float64(time.Second))
	}
	return time.Duration(latencyBuckets[len(latencyBuckets)-1] * float64(time.Second))
}
