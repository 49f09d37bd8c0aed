package feed

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"
)

// testFeed is a Changes that reports hostnames as a []string.
type testFeed struct{ *Changes }

func (d testFeed) add(hosts []string) { d.HostnamesChanged(hosts) }

// unpaced is a push that leaves the fleet no idle time and is delivered
// when it returns.
func unpaced(push func(context.Context, *Batch)) func(context.Context, *Batch) (<-chan struct{}, time.Duration) {
	return func(ctx context.Context, b *Batch) (<-chan struct{}, time.Duration) { push(ctx, b); return nil, 0 }
}

// testFleet stands for the streams the pushes are handed to: each push's
// delivery is a channel the test closes (deliver).
type testFleet struct {
	mu      sync.Mutex
	pending []chan struct{}
}

// handOut is one push's delivery, undelivered.
func (f *testFleet) handOut() <-chan struct{} {
	ch := make(chan struct{})
	f.mu.Lock()
	f.pending = append(f.pending, ch)
	f.mu.Unlock()
	return ch
}

// deliver marks every push handed out so far delivered.
func (f *testFleet) deliver() {
	f.mu.Lock()
	for _, ch := range f.pending {
		close(ch)
	}
	f.pending = nil
	f.mu.Unlock()
}

// startChanges runs c's consumer until the test ends.
func startChanges(t *testing.T, c *Changes, push func(context.Context, *Batch)) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx, unpaced(push)); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func startDebouncer(t *testing.T, after, max time.Duration) (testFeed, chan []string) {
	t.Helper()
	pushes := make(chan []string, 16)
	d := testFeed{NewChanges(after, max)}
	startChanges(t, d.Changes, func(_ context.Context, b *Batch) {
		var hosts []string
		for k := range b.Hosts {
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
	d := testFeed{NewChanges(200*time.Millisecond, time.Hour)}
	startChanges(t, d.Changes, func(_ context.Context, b *Batch) { pushes <- pushed{len(b.Hosts), b.Since} })
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
	d := testFeed{c}
	release := make(chan struct{})
	pushes := make(chan []string, 16)
	slow := true
	startChanges(t, c, func(_ context.Context, b *Batch) {
		var hosts []string
		for k := range b.Hosts {
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
		taken = c.incoming.Empty()
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

// startPaced runs c's consumer paced by fleet; every push is handed out
// to the fleet (delivered when the test says so) and reports its
// hostnames and when it ran.
func startPaced(t *testing.T, c *Changes, fleet *testFleet) chan pacedPush {
	pushes := make(chan pacedPush, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx, func(_ context.Context, b *Batch) (<-chan struct{}, time.Duration) {
			var hosts []string
			for k := range b.Hosts {
				hosts = append(hosts, k)
			}
			sort.Strings(hosts)
			delivered := fleet.handOut()
			pushes <- pacedPush{hosts, time.Now()}
			return delivered, 0
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return pushes
}

// startPacedChanges runs a paced feed whose pushes are delivered when the
// test says so.
func startPacedChanges(t *testing.T, after, max time.Duration) (*Changes, *testFleet, chan pacedPush) {
	c, fleet := NewChanges(after, max), &testFleet{}
	return c, fleet, startPaced(t, c, fleet)
}

type pacedPush struct {
	hosts []string
	at    time.Time
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

// A push is paced by what the last one cost: changes wait while the fleet
// still takes in the last push, and then for a quiet period as long as its
// delivery took; they coalesce into one push meanwhile.
func TestDebouncePacedByDelivery(t *testing.T) {
	const after = 5 * time.Millisecond
	c, fleet, pushes := startPacedChanges(t, after, time.Hour)
	d := testFeed{c}

	d.add([]string{"a"})
	first := nextPaced(t, pushes) // leading edge
	d.add([]string{"b"})
	d.add([]string{"c"})
	// Undelivered: nothing goes (with plain debouncing b and c would go
	// after 5 ms; give them forty times that).
	select {
	case p := <-pushes:
		t.Fatalf("pushed %v while the last push was undelivered", p.hosts)
	case <-time.After(200 * time.Millisecond):
	}
	answered := time.Now()
	fleet.deliver()
	second := nextPaced(t, pushes)
	if len(second.hosts) != 2 || second.hosts[0] != "b" || second.hosts[1] != "c" {
		t.Fatalf("push after delivery = %v; want [b c] coalesced", second.hosts)
	}
	if cost, q := answered.Sub(first.at), c.Quiet(); q < cost {
		t.Fatalf("quiet period after a push delivered in %v = %v; want at least the delivery time", cost, q)
	}
	// The fleet takes 150 ms to answer the second push, while d and e
	// are made: they go together, the new quiet period (150 ms, not 5 ms)
	// after e.
	const cost = 150 * time.Millisecond
	d.add([]string{"d"})
	time.Sleep(cost)
	added := time.Now()
	d.add([]string{"e"})
	waitTaken(c)
	fleet.deliver()
	third := nextPaced(t, pushes)
	if len(third.hosts) != 2 || third.hosts[0] != "d" || third.hosts[1] != "e" {
		t.Fatalf("push after the second delivery = %v; want [d e] coalesced", third.hosts)
	}
	if waited := third.at.Sub(added); waited < cost*9/10 {
		t.Fatalf("push %v went %v after its newest change; want the last delivery time, %v", third.hosts, waited, cost)
	}
}

// waitTaken waits until c's consumer took every reported change.
func waitTaken(c *Changes) {
	for {
		c.mu.Lock()
		taken := c.incoming.Empty()
		c.mu.Unlock()
		if taken {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// A push its fleet never answers is waited for at most `max`: then batches
// go by the plain debounce again.
func TestDebounceStopsWaitingForAnUndeliveredPush(t *testing.T) {
	const after, MaxWait = 5 * time.Millisecond, 2 * time.Second
	c, _, pushes := startPacedChanges(t, after, MaxWait)
	d := testFeed{c}

	d.add([]string{"a"})
	first := nextPaced(t, pushes)
	d.add([]string{"b"}) // waits for the push: at most maxWait from its first change
	second := nextPaced(t, pushes)
	if waited := second.at.Sub(first.at); waited < MaxWait {
		t.Fatalf("push of %v went %v after an undelivered push; want it held up to %v", second.hosts, waited, MaxWait)
	}
	// Neither push is ever answered: once maxWait passed since the last,
	// the next change is a leading edge with the plain quiet period.
	time.Sleep(MaxWait + 100*time.Millisecond)
	d.add([]string{"c"})
	added := time.Now()
	third := nextPaced(t, pushes)
	if waited := third.at.Sub(added); waited > MaxWait/2 {
		t.Fatalf("push of %v waited %v after a push given up on; want it at once", third.hosts, waited)
	}
	if q := c.Quiet(); q != after {
		t.Fatalf("quiet period = %v after giving up on a push; want %v", q, after)
	}
}

// A change made late in an undelivered push's wait goes when the push is
// given up on, `max` after it, not `max` after the change.
func TestDebounceGivesUpOnAPushOnTime(t *testing.T) {
	const after, MaxWait = 5 * time.Millisecond, 2 * time.Second
	c, _, pushes := startPacedChanges(t, after, MaxWait)
	d := testFeed{c}

	d.add([]string{"a"})
	first := nextPaced(t, pushes)
	time.Sleep(MaxWait * 7 / 10)
	d.add([]string{"b"}) // never answered push: b waits until it is given up on
	second := nextPaced(t, pushes)
	if waited := second.at.Sub(first.at); waited < MaxWait || waited >= MaxWait*3/2 {
		t.Fatalf("push of %v went %v after the undelivered push; want when it is given up on, %v after it (not %v after b)", second.hosts, waited, MaxWait, MaxWait)
	}
}

// startCostlyPaced runs a paced feed whose fleet takes cost to answer each
// push (100 responses); delivered receives once per push after its answers.
func startCostlyPaced(t *testing.T, after, max, cost time.Duration) (testFeed, chan pacedPush, chan struct{}) {
	c := NewChanges(after, max)
	delivered := make(chan struct{}, 64)
	pushes := make(chan pacedPush, 64)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var answers sync.WaitGroup
	go func() {
		defer close(done)
		c.Run(ctx, func(_ context.Context, b *Batch) (<-chan struct{}, time.Duration) {
			answered := make(chan struct{})
			pushes <- pacedPush{at: time.Now()}
			answers.Add(1)
			time.AfterFunc(cost, func() {
				defer answers.Done()
				close(answered)
				delivered <- struct{}{}
			})
			return answered, 0
		})
	}()
	t.Cleanup(func() { cancel(); <-done; answers.Wait() })
	return testFeed{c}, pushes, delivered
}

// The rhythm of congestion collapse: the changes come in small bursts
// shortly after the last push was delivered (the API servers the fleet
// starved catch up, several writers at once), with gaps longer than
// `after` in between. Judged by `after` alone each burst would be a
// leading edge; the feed backs off instead.
func TestDebounceBacksOffUnderChurn(t *testing.T) {
	const after, longest, cost = 5 * time.Millisecond, time.Second, 150 * time.Millisecond
	d, pushes, delivered := startCostlyPaced(t, after, longest, cost)
	start := time.Now()
	changes := 0
	for time.Since(start) < 4*time.Second {
		d.add([]string{fmt.Sprint("svc-", changes)})
		d.add([]string{fmt.Sprint("svc-", changes+1)})
		changes += 2
		select {
		case <-delivered:
			time.Sleep(2 * after) // the starved writers' next changes, soon after delivery
		case <-time.After(500 * time.Millisecond): // or, while nothing is pushed, they go on
		}
	}
	// Without backing off: a push per burst (about 25). With it: the
	// spacing doubles from the cost (150 ms) to max (1 s), about 8.
	n := len(pushes)
	if n > 14 {
		t.Fatalf("%d pushes (%d leading edge, %d quiet, %d max wait) for %d changes in 4s of churn; want the feed to back off (at most 14)", n, d.Pushes(LeadingEdge), d.Pushes(QuietAfter), d.Pushes(MaxWait), changes)
	}
	if got := d.Pushes(LeadingEdge); got > 3 {
		t.Fatalf("%d of %d pushes took the leading edge under churn; want at most 3", got, n)
	}
	t.Logf("%d changes, %d pushes (%d leading edge, %d quiet, %d max wait)", changes, n, d.Pushes(LeadingEdge), d.Pushes(QuietAfter), d.Pushes(MaxWait))
}

// A writer that waits for each write to reach the fleet and then writes
// again soon (hubbench's write loop on a fleet that takes most of the
// time to take a push in) is no churn: each write waits at most until the
// fleet rested half the last push's cost, never backs the feed off, and
// never waits for max.
func TestDebounceWriterThatWaitsIsNoChurn(t *testing.T) {
	const after, longest, cost = 5 * time.Millisecond, 2 * time.Second, 200 * time.Millisecond
	d, pushes, delivered := startCostlyPaced(t, after, longest, cost)
	for i := range 12 {
		added := time.Now()
		d.add([]string{fmt.Sprint("write-", i)})
		p := nextPaced(t, pushes)
		<-delivered
		if waited := p.at.Sub(added); waited > longest/2 {
			t.Fatalf("write %d waited %v for its push; want at most half the last push's cost (about %v), far below max (%v)", i, waited, cost/2, longest)
		}
		time.Sleep(4 * after) // less than half the push cost: the fleet has not rested
	}
	if got := d.Pushes(MaxWait); got != 0 {
		t.Fatalf("%d pushes waited for max; want none", got)
	}
}

// One-off writes, each after the last was delivered and a pause longer
// than the push cost (a person at kubectl, or hubbench's write loop): every
// one takes the leading edge, also after the feed backed off.
func TestDebounceOneOffWritesKeepTheLeadingEdge(t *testing.T) {
	const after, longest, cost = 5 * time.Millisecond, 300 * time.Millisecond, 30 * time.Millisecond
	d, pushes, delivered := startCostlyPaced(t, after, longest, cost)
	// Churn first, so that the spacing has grown; then a calm longer than
	// any spacing, in which every push goes and is delivered.
	for i := range 20 {
		d.add([]string{fmt.Sprint("churn-", i)})
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(2*longest + cost)
	for len(pushes) > 0 || len(delivered) > 0 {
		select {
		case <-pushes:
		case <-delivered:
		}
	}
	if d.Pushes(QuietAfter)+d.Pushes(MaxWait) == 0 {
		t.Fatal("the churn made no push besides leading edges; want it to have backed off")
	}
	lead := d.Pushes(LeadingEdge)
	for i := range 5 {
		added := time.Now()
		d.add([]string{fmt.Sprint("write-", i)})
		p := nextPaced(t, pushes)
		<-delivered
		if got := d.Pushes(LeadingEdge); got != lead+int64(i)+1 {
			t.Fatalf("write %d went %v after it was made, not as a leading edge (%d leading edges, want %d)", i, p.at.Sub(added), got, lead+int64(i)+1)
		}
		time.Sleep(3 * cost)
		time.Sleep(d.Quiet()) // longer than the push cost, as measured on a loaded machine too
	}
}
