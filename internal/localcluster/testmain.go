package localcluster

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"
)

// RunTests is a TestMain helper: it starts local clusters with the given
// names, stores them in *env, runs the tests and stops the clusters, also on
// SIGINT/SIGTERM. When the clusters cannot be started it fails the run in CI
// (CI set); elsewhere it leaves *env nil so that Require skips with a reason.
// It returns the exit code for os.Exit, so that the caller can clean up first.
func RunTests(m *testing.M, env **Env, names ...string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	e, err := Start(ctx, Options{Names: names})
	cancel()
	if err != nil {
		startErr = err
		if os.Getenv("CI") != "" {
			fmt.Fprintf(os.Stderr, "FAIL: local clusters are required in CI: %v\n", err)
			return 1
		}
		return m.Run()
	}
	*env = e
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		if _, ok := <-sigs; ok {
			e.Stop()
			os.Exit(2)
		}
	}()
	code := m.Run()
	signal.Stop(sigs)
	close(sigs)
	e.Stop()
	return code
}

var startErr error

// Require returns env, or skips the test (outside CI) / fails it (in CI)
// saying why the local clusters are missing.
func Require(t testing.TB, env *Env) *Env {
	t.Helper()
	if env != nil {
		return env
	}
	msg := fmt.Sprintf("local clusters unavailable: %v", startErr)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg + " (skipping outside CI; in CI this fails)")
	return nil
}
