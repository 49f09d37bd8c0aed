package pacing

import (
	"context"
	"reflect"
	"testing"
	"time"
)

// pace hands out waves of at least MinWave items, at most paceWaves of
// them, and the next only once the fleet answered the last (all but
// unanswered of it).
func TestPaceWaitsForEachWave(t *testing.T) {
	d := &Deliveries{}
	items := make([]int, 3*MinWave+4)
	for i := range items {
		items[i] = i
	}
	waves := make(chan []int)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Pace(context.Background(), d, items, time.Minute, func(wave []int) {
			for range wave {
				d.Hand()
			}
			waves <- wave
		})
	}()
	var sizes []int
	next := 0
	for wave := range chanUntil(waves, done) {
		if wave[0] != next {
			t.Fatalf("wave starts at item %d; want %d", wave[0], next)
		}
		next += len(wave)
		sizes = append(sizes, len(wave))
		// The next wave waits for these answers: nothing else can send
		// on waves until the test answers.
		select {
		case w := <-waves:
			t.Fatalf("wave of %d handed out before the last was answered", len(w))
		default:
		}
		d.Answer(len(wave))
	}
	if want := []int{MinWave, MinWave, MinWave, 4}; !reflect.DeepEqual(sizes, want) {
		t.Fatalf("waves of %v; want %v", sizes, want)
	}
}

// chanUntil yields what ch carries until done is closed.
func chanUntil[T any](ch <-chan T, done <-chan struct{}) func(func(T) bool) {
	return func(yield func(T) bool) {
		for {
			select {
			case v := <-ch:
				if !yield(v) {
					return
				}
			case <-done:
				return
			}
		}
	}
}

// pace stops between waves when its context ends, also while it waits for
// a wave's answers.
func TestPaceStopsWithItsContext(t *testing.T) {
	d := &Deliveries{}
	ctx, cancel := context.WithCancel(context.Background())
	var pushed int
	Pace(ctx, d, make([]int, 4*MinWave), time.Hour, func(wave []int) {
		pushed++
		for range wave {
			d.Hand()
		}
		cancel() // never answered: only the context ends the wait
	})
	if pushed != 1 {
		t.Fatalf("%d waves pushed; want 1", pushed)
	}
}

// A fleet that never answers holds a paced push back at most its limit:
// then the rest goes at once.
func TestPaceHandsOutTheRestAtItsLimit(t *testing.T) {
	d := &Deliveries{}
	var sizes []int
	Pace(context.Background(), d, make([]int, 4*MinWave), 50*time.Millisecond, func(wave []int) {
		sizes = append(sizes, len(wave))
		for range wave {
			d.Hand()
		}
	})
	if want := []int{MinWave, 3 * MinWave}; !reflect.DeepEqual(sizes, want) {
		t.Fatalf("waves of %v; want %v", sizes, want)
	}
}

// A push that hands nothing out is delivered when it returns; so is one
// to a small fleet, or one already answered.
func TestDeliveriesSmallOrAnswered(t *testing.T) {
	fleet := &Deliveries{}
	m := fleet.Mark()
	if ch := fleet.Await(m); ch != nil {
		t.Fatal("await with nothing handed returned a channel; want nil")
	}
	for range 16 {
		fleet.Hand()
	}
	select {
	case <-fleet.Await(m):
	default:
		t.Fatal("a push of 16 responses, none answered, is waited for; want a small fleet never paced")
	}
	m = fleet.Mark()
	for range 1000 {
		fleet.Hand()
	}
	fleet.Answer(900) // answered before the push returned
	select {
	case <-fleet.Await(m):
	default:
		t.Fatal("await of a push already answered did not return at once")
	}
}

// A push counts as delivered once all but a tenth (at least 16) of what it
// handed out is answered: 80 of 100 is not enough, 84 is.
func TestDeliveriesAllButAFew(t *testing.T) {
	fleet := &Deliveries{}
	m := fleet.Mark()
	for range 100 {
		fleet.Hand()
	}
	delivered := fleet.Await(m)
	fleet.Answer(80)
	select {
	case <-delivered:
		t.Fatal("delivered with 80 of 100 responses answered")
	default:
	}
	fleet.Answer(4)
	select {
	case <-delivered:
	default:
		t.Fatal("not delivered with 84 of 100 responses answered (all but 16)")
	}
	// A second push counts only the answers after its own mark: the 84
	// above, and 16 late answers to the first push, are none of them.
	m = fleet.Mark()
	for range 100 {
		fleet.Hand()
	}
	delivered = fleet.Await(m)
	fleet.Answer(80)
	select {
	case <-delivered:
		t.Fatal("second push delivered with 80 of its 100 responses answered")
	default:
	}
	fleet.Answer(4)
	select {
	case <-delivered:
	default:
		t.Fatal("second push not delivered with 84 of its 100 responses answered")
	}
}
