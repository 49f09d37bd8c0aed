package expiry

import (
	"testing"
	"time"
)

func TestLevelAndWords(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	for _, tc := range []struct {
		notAfter time.Time
		level    Level
		badge    string
	}{
		{time.Time{}, Valid, ""},
		{now.Add(30 * day), Valid, "expires in 30d"},
		{now.Add(7*day + time.Second), Valid, "expires in 7d"},
		{now.Add(7 * day), Expiring, "expires in 7d"},
		{now.Add(3*day - time.Minute), Expiring, "expires in 2d"},
		{now.Add(5*time.Hour + 30*time.Minute), Expiring, "expires in 5h"},
		{now.Add(12*time.Minute + 59*time.Second), Expiring, "expires in 12m"},
		{now, Expired, "expired"},
		{now.Add(-day), Expired, "expired"},
	} {
		if got := LevelAt(tc.notAfter, now, 0); got != tc.level {
			t.Errorf("LevelAt(%v) = %v; want %v", tc.notAfter, got, tc.level)
		}
		if got := Badge(tc.notAfter, now); got != tc.badge {
			t.Errorf("Badge(%v) = %q; want %q", tc.notAfter, got, tc.badge)
		}
	}
	if got := LevelAt(now.Add(2*day), now, day); got != Valid {
		t.Errorf("a one-day window grades two days ahead %v", got)
	}
	if got := Sentence(now.Add(-90*time.Minute), now); got != "expired at 2026-11-28T10:30:00Z (1h ago)" {
		t.Errorf("Sentence = %q", got)
	}
}

func TestWarnedOncePerCrossing(t *testing.T) {
	var w Warned
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	steps := []struct {
		notAfter time.Time
		level    Level
		due      bool
	}{
		{at, Valid, false},
		{at, Expiring, true},
		{at, Expiring, false},
		{at, Expired, true},
		{at, Expired, false},
		{at, Expiring, false},               // a clock step back does not warn again
		{at.Add(time.Hour), Expiring, true}, // a new credential
	}
	for i, s := range steps {
		due := w.Due("k", s.notAfter, s.level)
		if due != s.due {
			t.Fatalf("step %d: Due = %v; want %v", i, due, s.due)
		}
		if due {
			w.Mark("k", s.notAfter, s.level)
		}
	}
	w.Retain(func(string) bool { return false })
	if !w.Due("k", at.Add(time.Hour), Expiring) {
		t.Error("a forgotten object is not warned of again")
	}
}
