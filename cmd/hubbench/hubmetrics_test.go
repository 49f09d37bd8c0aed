package main

import "testing"

// TestHistogramQuantile reads a Prometheus histogram's buckets as the
// summary does: a write phase's counts are the reading after it minus the
// one before, and a quantile is the upper bound of the bucket holding it.
func TestHistogramQuantile(t *testing.T) {
	before := histogram{Buckets: map[string]float64{"0.001": 10, "0.01": 10, "0.1": 10, "+Inf": 10}, Sum: 0.005, Count: 10}
	after := histogram{Buckets: map[string]float64{"0.001": 60, "0.01": 105, "0.1": 109, "+Inf": 110}, Sum: 0.505, Count: 110}
	d := after.since(before)
	if d.Count != 100 || d.Sum != 0.5 {
		t.Fatalf("since: count %v sum %v, want 100 and 0.5", d.Count, d.Sum)
	}
	for _, c := range []struct{ q, wantMs float64 }{{0.5, 1}, {0.51, 10}, {0.95, 10}, {0.99, 100}, {1, -1}} {
		if got := d.quantile(c.q); got != c.wantMs {
			t.Errorf("quantile(%v) = %v ms, want %v", c.q, got, c.wantMs)
		}
	}
	if got := (histogram{}).quantile(0.5); got != -1 {
		t.Errorf("empty histogram: quantile %v ms, want -1 (none)", got)
	}
}
