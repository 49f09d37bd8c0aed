package xdsstatus

import (
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The dashboard's percentiles come from the fixed buckets of the last five
// minutes.
func TestPushLatencySummary(t *testing.T) {
	var l *PushLatency
	if s := l.Summary(); s.Count != 0 {
		t.Fatalf("nil summary = %+v", s)
	}
	l = NewPushLatency()
	if s := l.Summary(); s.Count != 0 || s.P50 != 0 || s.P99 != 0 {
		t.Fatalf("empty summary = %+v", s)
	}
	now := time.Now()
	for range 98 {
		l.Observe("ClusterLoadAssignment", now) // within the first bucket (≤ 1 ms) unless the machine stalls
	}
	l.Observe("ClusterLoadAssignment", now.Add(-time.Hour)) // beyond the last bucket
	l.Observe("ClusterLoadAssignment", now.Add(-time.Hour)) // beyond the last bucket
	l.Observe("", now)                                      // not a served type: ignored
	l.Observe("ClusterLoadAssignment", time.Time{})         // no change time: ignored
	reg := prometheus.NewRegistry()
	reg.MustRegister(l.Collector())
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var series []string
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				series = append(series, lp.GetName()+"="+lp.GetValue())
			}
		}
	}
	if !slices.Equal(series, []string{"type=ClusterLoadAssignment"}) {
		t.Errorf("push latency series %v; want only the served type observed", series)
	}
	s := l.Summary()
	if s.Count != 100 {
		t.Fatalf("summary counts %d; want 100", s.Count)
	}
	if s.P50 <= 0 || s.P50 > 10*time.Second || s.P99 != 30*time.Second {
		t.Fatalf("summary = %+v; want a small p50 and p99 at the top bound (30s)", s)
	}
}
