package pilotagent

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeAgent writes a script that stands in for pilot-agent as a process
// tree: it starts a child (as pilot-agent starts Envoy) that sleeps for a
// number of seconds no other process uses (the child's mark), writes
// "started" to child.started in its working directory, and waits.
func fakeAgent(t *testing.T) (bin, mark string) {
	t.Helper()
	bin = filepath.Join(t.TempDir(), "pilot-agent")
	mark = strconv.Itoa(3_000_000 + int(time.Now().UnixNano()%1_000_000))
	script := "#!/bin/sh\nsleep " + mark + " &\necho started > child.started\nwait\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, mark
}

// waitChild waits until the fake agent has started its child.
func waitChild(t *testing.T, p *Process) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.WaitFiles(ctx, filepath.Join(p.Dir, "child.started")); err != nil {
		t.Fatal(err)
	}
}

// running says whether a live process (not a zombie) runs "sleep <mark>":
// the child's PID in its own PID namespace means nothing here.
func running(mark string) bool {
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err != nil || string(cmd) != "sleep\x00"+mark+"\x00" {
			continue
		}
		if stat, err := os.ReadFile("/proc/" + d.Name() + "/stat"); err == nil {
			if f := strings.Fields(string(stat)); len(f) > 2 && f[2] != "Z" {
				return true
			}
		}
	}
	return false
}

// gone waits until the marked child no longer runs.
func gone(mark string) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if !running(mark) {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

func options(t *testing.T, bin string) Options {
	return Options{Bin: bin, Dir: t.TempDir(), Token: []byte("token"), RootPEM: []byte("roots"), ClusterID: "west",
		Namespace: "ns", ServiceAccount: "sa", PodName: "pod", PodIP: "127.0.0.1", TrustDomain: "td.test",
		HubAddr: "127.0.0.1:15012", HubName: "hub.hub-system.svc"}
}

// TestStopEndsTheProcessGroup: what the agent started (its Envoy) stops
// with it, even though a child ignores the agent's own exit.
func TestStopEndsTheProcessGroup(t *testing.T) {
	bin, mark := fakeAgent(t)
	p, err := Start(options(t, bin))
	if err != nil {
		t.Fatal(err)
	}
	waitChild(t, p)
	if !running(mark) {
		t.Fatal("the fake agent's child is not found running")
	}
	p.Stop()
	if !gone(mark) {
		t.Error("the agent's child outlived Stop")
	}
	if p.Exited() == nil {
		t.Error("the agent runs after Stop")
	}
	for _, f := range []string{"var/run/secrets/tokens/istio-token", "var/run/secrets/istio/root-cert.pem", "etc/istio/pod/labels"} {
		if _, err := os.Stat(filepath.Join(p.Dir, f)); err != nil {
			t.Errorf("the pod's volume %s: %v", f, err)
		}
	}
}

// TestProxyDiesWholeWithItsWrapper: a data-plane proxy's agent runs in a
// PID namespace of its own, so that when the process we started dies
// without Stop (SIGKILL, as when the caller dies: Pdeathsig), its Envoy
// dies too.
func TestProxyDiesWholeWithItsWrapper(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a PID and mount namespace need root")
	}
	bin, mark := fakeAgent(t)
	o := options(t, bin)
	o.Envoy = o.Bin // never run by the fake agent
	o.Proxy = &Proxy{Istiod: "127.0.0.1:15010", Network: "net", AdminPort: 15000}
	p, err := Start(o)
	if err != nil {
		if strings.Contains(err.Error(), "bootstrap template") || strings.Contains(err.Error(), "module cache") {
			t.Skipf("no Istio module: %v", err)
		}
		t.Fatal(err)
	}
	defer p.Stop()
	waitChild(t, p)
	if !running(mark) {
		t.Fatal("the fake agent's child is not found running")
	}
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL); err != nil { // the wrapper alone
		t.Fatal(err)
	}
	if !gone(mark) {
		t.Error("the agent's child outlived its wrapper")
	}
}
