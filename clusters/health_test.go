package clusters

import (
	"errors"
	"testing"
)

func TestReadyzFailure(t *testing.T) {
	body := errors.New(`an error on the server ("[+]ping ok\n[+]log ok\n[-]etcd failed: reason withheld\n[-]etcd-readiness failed: reason withheld\n[+]informer-sync ok\nreadyz check failed") has prevented the request from succeeding`)
	if got := readyzFailure(body); got != "failing checks: etcd, etcd-readiness" {
		t.Errorf("readyzFailure = %q", got)
	}
	if got := readyzFailure(errors.New("context deadline exceeded")); got != "context deadline exceeded" {
		t.Errorf("readyzFailure = %q", got)
	}
}
