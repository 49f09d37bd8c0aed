package hub

import (
	"context"
	"sort"
	"testing"
	"time"
)

func startDebouncer(t *testing.T, after, max time.Duration) (*debouncer, chan []string) {
	t.Helper()
	pushes := make(chan []string, 16)
	d := newDebouncer(after, max, func(h map[string]struct{}) {
		var hosts []string
		for k := range h {
			hosts = append(hosts, k)
		}
		sort.Strings(hosts)
		pushes <- hosts
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return d, pushes
}

func nextPush(t *testing.T, pushes chan []string) []string {
	t.Helper()
	select {
	case p := <-pushes:
		return p
	case <-time.After(10 * time.Second):
		t.Fatal("no push within 10s")
		return nil
	}
}

func TestDebounceLeadingEdge(t *testing.T) {
	// With a one-hour quiet period, only the leading edge can push at once.
	d, pushes := startDebouncer(t, time.Hour, 2*time.Hour)
	d.add([]string{"a"})
	if got := nextPush(t, pushes); len(got) != 1 || got[0] != "a" {
		t.Fatalf("first push = %v; want [a] at once", got)
	}
}

func TestDebounceBatchesInsideWindow(t *testing.T) {
	d, pushes := startDebouncer(t, 200*time.Millisecond, time.Hour)
	d.add([]string{"a"})
	nextPush(t, pushes) // leading edge
	d.add([]string{"b"})
	d.add([]string{"c", "b"})
	if got := nextPush(t, pushes); len(got) != 2 || got[0] != "b" || got[1] != "c" {
		t.Fatalf("batched push = %v; want [b c] in one push", got)
	}
}

func TestDebounceMaxWait(t *testing.T) {
	// Changes keep arriving faster than the quiet period: debounce-max forces a push.
	d, pushes := startDebouncer(t, 300*time.Millisecond, 600*time.Millisecond)
	d.add([]string{"lead"})
	nextPush(t, pushes)
	stop := time.After(10 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case got := <-pushes:
			if len(got) == 0 {
				t.Fatal("empty push")
			}
			return // pushed although changes never went quiet
		case <-tick.C:
			d.add([]string{"busy"})
		case <-stop:
			t.Fatal("debounce-max did not force a push while changes kept arriving")
		}
	}
}
