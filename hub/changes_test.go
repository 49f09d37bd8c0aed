package hub

import (
	"context"
	"sort"
	"testing"
	"time"
)

// debouncer is a Changes that reports hostnames as a []string.
type debouncer struct{ *Changes }

func (d debouncer) add(hosts []string) { d.HostnamesChanged(hosts) }

// startChanges runs c's consumer until the test ends.
func startChanges(t *testing.T, c *Changes, push func(*batch)) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.run(ctx, push); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func startDebouncer(t *testing.T, after, max time.Duration) (debouncer, chan []string) {
	t.Helper()
	pushes := make(chan []string, 16)
	d := debouncer{NewChanges(after, max)}
	startChanges(t, d.Changes, func(b *batch) {
		var hosts []string
		for k := range b.hosts {
			hosts = append(hosts, k)
		}
		sort.Strings(hosts)
		pushes <- hosts
	})
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

// A batch is pushed with the time its oldest change was added: push
// latency is measured from a batch's first change.
func TestDebounceCarriesOldestChangeTime(t *testing.T) {
	type pushed struct {
		n     int
		since time.Time
	}
	pushes := make(chan pushed, 16)
	d := debouncer{NewChanges(200*time.Millisecond, time.Hour)}
	startChanges(t, d.Changes, func(b *batch) { pushes <- pushed{len(b.hosts), b.since} })
	next := func() pushed {
		t.Helper()
		select {
		case b := <-pushes:
			return b
		case <-time.After(10 * time.Second):
			t.Fatal("no push within 10s")
			return pushed{}
		}
	}

	before := time.Now()
	d.add([]string{"a"})
	after := time.Now()
	if b := next(); b.n != 1 || b.since.Before(before) || b.since.After(after) {
		t.Fatalf("leading-edge push since %v; want between %v and %v", b.since, before, after)
	}
	before = time.Now()
	d.add([]string{"b"})
	after = time.Now()
	d.add([]string{"c", "b"})
	// On a slow machine b may go alone (a new leading edge); either way
	// the push holding b is stamped with b's time, not c's.
	if b := next(); b.since.Before(before) || b.since.After(after) {
		t.Fatalf("push of %d since %v; want since b was added, between %v and %v", b.n, b.since, before, after)
	}
}

// Changes made while a push runs longer than the quiet period are not a
// leading edge when it returns: they were made right after the pushed
// ones, so they wait for quiet and coalesce with what follows (judged by
// when changes were made, not when they were taken). Otherwise sustained
// churn with slow pushes pushes every batch at once, back to back.
func TestDebounceChangesDuringASlowPushWait(t *testing.T) {
	const after = time.Second
	c := NewChanges(after, time.Hour)
	d := debouncer{c}
	release := make(chan struct{})
	pushes := make(chan []string, 16)
	slow := true
	startChanges(t, c, func(b *batch) {
		var hosts []string
		for k := range b.hosts {
			hosts = append(hosts, k)
		}
		sort.Strings(hosts)
		pushes <- hosts
		if slow {
			slow = false
			<-release // the first push lasts longer than the quiet period
		}
	})
	d.add([]string{"a"})
	if got := nextPush(t, pushes); len(got) != 1 || got[0] != "a" {
		t.Fatalf("first push = %v; want [a] at once", got)
	}
	d.add([]string{"b"})        // made during the slow push, right after a
	time.Sleep(after + after/5) // the push outlasts the quiet period
	close(release)
	for taken := false; !taken; { // the consumer takes b
		c.mu.Lock()
		taken = c.incoming.empty()
		c.mu.Unlock()
		if !taken {
			time.Sleep(time.Millisecond)
		}
	}
	d.add([]string{"c"}) // within the quiet period of b: one push with both
	if got := nextPush(t, pushes); len(got) != 2 || got[0] != "b" || got[1] != "c" {
		t.Fatalf("push after the slow one = %v; want [b c] coalesced (b was no leading edge)", got)
	}
}
