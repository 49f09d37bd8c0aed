package clusters

import (
	"slices"
	"testing"
)

func TestFailedChecks(t *testing.T) {
	body := "[+]ping ok\n[+]log ok\n[-]etcd failed: reason withheld\n[-]etcd-readiness failed: reason withheld\n[+]informer-sync ok\nreadyz check failed"
	if got := failedChecks(body); !slices.Equal(got, []string{"etcd", "etcd-readiness"}) {
		t.Errorf("failedChecks = %q", got)
	}
	if got := failedChecks("context deadline exceeded"); got != nil {
		t.Errorf("failedChecks = %q", got)
	}
}
