package main

import (
	"os"
	"testing"
	"time"
)

// procStats reads a process's CPU at the scheduler's resolution, not in
// 10 ms ticks: spinning, the clock is seen to advance by about a
// millisecond at a time. (What the spin costs in wall time depends on the
// machine's load; what the clock shows of it does not.)
func TestProcStatsCPUClock(t *testing.T) {
	first, ok := processCPU(os.Getpid())
	if !ok {
		t.Fatal("the process CPU clock is not readable: procStats would count 10 ms ticks")
	}
	deadline := time.Now().Add(time.Minute)
	for {
		now, _ := processCPU(os.Getpid())
		if step := now - first; step >= time.Millisecond {
			if step >= 10*time.Millisecond {
				t.Fatalf("the clock moved by %s at once; want finer than a 10 ms tick", step)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the process CPU clock did not advance in a minute of spinning")
		}
	}
	st, err := procStats(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if now, _ := processCPU(os.Getpid()); st.CPUSeconds > now.Seconds() || st.CPUSeconds < first.Seconds() {
		t.Fatalf("procStats says %.6f s; the clock %s after %s", st.CPUSeconds, now, first)
	}
}
