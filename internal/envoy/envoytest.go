package envoy

import (
	"context"
	"os"
	"testing"
	"time"
)

// BinaryT returns Binary(), or skips the test when $HUB_ENVOY_BIN is unset
// (fails it under CI, where make test sets it).
func BinaryT(t testing.TB) string {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		if os.Getenv("CI") != "" || os.Getenv(BinEnv) != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	return bin
}

// StartT starts an Envoy for a test (Bin defaults to BinaryT, Dir to a
// t.TempDir()), waiting up to 30 s for its admin API, and stops it when the
// test ends, logging the end of its log if the test failed.
func StartT(t testing.TB, o Options) *Process {
	t.Helper()
	if o.Bin == "" {
		o.Bin = BinaryT(t)
	}
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("stopping envoy: %v", err)
		} else if t.Failed() {
			t.Logf("envoy (%s) log, last lines:\n%s", o.Dir, p.LogTail(logTailLines))
		}
	})
	return p
}
