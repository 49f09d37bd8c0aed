// Package wait has the one polling helper the tests share: wait for a
// condition instead of sleeping.
package wait

import (
	"testing"
	"time"
)

// Until polls cond every 20 ms until it returns nil, failing the test with
// cond's last error if timeout passes first.
func Until(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s: %v", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
