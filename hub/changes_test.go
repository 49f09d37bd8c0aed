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
	startPacedChanges(t, c, func(b *batch) *delivery { push(b); return nil })
}

// startPacedChanges runs c's consumer with a push that returns its
// delivery until the test ends.
func startPacedChanges(t *testing.T, c *Changes, push func(*batch) *delivery) {
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

// pacedFeed runs a Changes whose pushes return deliveries the test
// completes: each push gets a delivery holding one response, sent on
// deliveries with the pushed hostnames.
type pacedPush struct {
	hosts []string
	tok   *deliveryToken
	d     *delivery
}

func startPacedFeed(t *testing.T, c *Changes) chan pacedPush {
	t.Helper()
	pushes := make(chan pacedPush, 16)
	startPacedChanges(t, c, func(b *batch) *delivery {
		var hosts []string
		for k := range b.hosts {
			hosts = append(hosts, k)
		}
		sort.Strings(hosts)
		d := newDelivery()
		tok := d.token()
		d.seal()
		pushes <- pacedPush{hosts, tok, d}
		return d
	})
	return pushes
}

func nextPaced(t *testing.T, pushes chan pacedPush) pacedPush {
	t.Helper()
	select {
	case p := <-pushes:
		return p
	case <-time.After(10 * time.Second):
		t.Fatal("no push within 10s")
		return pacedPush{}
	}
}

func expectNoPaced(t *testing.T, pushes chan pacedPush, within time.Duration, why string) {
	t.Helper()
	select {
	case p := <-pushes:
		t.Fatalf("push of %v %s", p.hosts, why)
	case <-time.After(within):
	}
}

// A change the debounce would push at once (a leading edge) waits while
// the previous push is being delivered, and goes out as soon as it is,
// with everything changed meanwhile.
func TestPushWaitsForThePreviousDelivery(t *testing.T) {
	c := NewChanges(10*time.Millisecond, time.Hour)
	c.stall = time.Hour
	pushes := startPacedFeed(t, c)
	d := debouncer{c}
	d.add([]string{"a"})
	first := nextPaced(t, pushes)
	time.Sleep(20 * time.Millisecond) // b is a leading edge by time
	d.add([]string{"b"})
	d.add([]string{"c"})
	expectNoPaced(t, pushes, 200*time.Millisecond, "while the previous push is being delivered")
	first.tok.release()
	if got := nextPaced(t, pushes); len(got.hosts) != 2 || got.hosts[0] != "b" || got.hosts[1] != "c" {
		t.Fatalf("push after the delivery = %v; want [b c]", got.hosts)
	}
}

// A delivery that never ends (a stream that stopped reading) holds the
// next push back for at most debounce-max, and for no longer than it makes
// progress: once no stream took a response for a whole stall period, the
// rest do not hold anyone back.
func TestPushWaitsForAStuckDeliveryOnlySoLong(t *testing.T) {
	for _, tc := range []struct {
		name           string
		maxWait, stall time.Duration
	}{
		{"debounce-max", 300 * time.Millisecond, time.Hour},
		{"stall period", time.Hour, 150 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewChanges(10*time.Millisecond, tc.maxWait)
			c.stall = tc.stall
			pushes := startPacedFeed(t, c)
			d := debouncer{c}
			d.add([]string{"a"})
			nextPaced(t, pushes) // never delivered
			start := time.Now()
			d.add([]string{"b"})
			if got := nextPaced(t, pushes); len(got.hosts) != 1 || got.hosts[0] != "b" {
				t.Fatalf("push = %v; want [b]", got.hosts)
			}
			if waited, want := time.Since(start), min(tc.maxWait, tc.stall); waited < want-20*time.Millisecond {
				t.Fatalf("b went out after %v; want it held for %v", waited, want)
			}
		})
	}
}

// A delivery counts each response once, whether the stream took it, its
// watch was cancelled (the response dropped), or both.
func TestDeliveryCountsEachResponseOnce(t *testing.T) {
	d := newDelivery()
	a, b := d.token(), d.token()
	d.seal()
	a.release()
	a.release()
	select {
	case <-d.done:
		t.Fatal("done with one of two responses taken")
	default:
	}
	w := newWatcher(nil, 1, nil)
	wt := &watch{sub: &subscriber{}}
	wt.token.Store(b)
	w.cancel(wt) // dropped: the watch was cancelled with the response queued
	b.release()  // and taken after all
	select {
	case <-d.done:
	default:
		t.Fatal("not done with every response taken or dropped")
	}
	if n, _ := d.progress(); n != 2 {
		t.Fatalf("taken = %d; want 2", n)
	}
	var none *deliveryToken
	none.release() // a response no push queued
}

// The slowest streams do not hold a push's delivery: it is delivered once
// deliveredShare of its responses are taken, and reports itself slow once
// the rest take slowFactor times what the first half took.
func TestDeliveryDoesNotWaitForTheSlowest(t *testing.T) {
	d := newDelivery()
	toks := make([]*deliveryToken, 40)
	for i := range toks {
		toks[i] = d.token()
	}
	d.seal()
	for _, tok := range toks[:37] {
		tok.release()
	}
	select {
	case <-d.done:
		t.Fatal("delivered with 37 of 40 responses taken")
	default:
	}
	toks[37].release()
	select {
	case <-d.done:
	default:
		t.Fatal("not delivered with 38 of 40 (95 %) taken")
	}

	d = newDelivery()
	a, _ := d.token(), d.token()
	d.seal()
	start := time.Now()
	a.release() // half, at once
	for {
		if _, slow := d.progress(); slow {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatal("a delivery whose second half takes far longer than its first is never slow")
		}
		time.Sleep(time.Millisecond)
	}
}
