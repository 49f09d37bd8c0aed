package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// perfRecorder samples the hub's CPU with Linux perf (call graphs by frame
// pointer, which Go binaries keep) for one phase of the run: the hub needs
// no profiling endpoint, and the profile covers exactly the writes.
type perfRecorder struct {
	cmd  *exec.Cmd
	done chan error
}

// startPerf starts `perf record` on pid into out.
func startPerf(pid int, out string) (*perfRecorder, error) {
	bin, err := exec.LookPath("perf")
	if err != nil {
		return nil, fmt.Errorf("--hub-perf needs Linux perf on PATH: %w", err)
	}
	cmd := exec.Command(bin, "record", "-q", "-F", "499", "-g", "-p", strconv.Itoa(pid), "-o", out)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting perf record: %w", err)
	}
	r := &perfRecorder{cmd: cmd, done: make(chan error, 1)}
	go func() { r.done <- cmd.Wait() }()
	return r, nil
}

// stop ends the recording (perf writes its file on SIGINT) and waits for it.
func (r *perfRecorder) stop() error {
	if r == nil {
		return nil
	}
	if err := r.cmd.Process.Signal(os.Interrupt); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stopping perf record: %w", err)
	}
	select {
	case err := <-r.done:
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			return fmt.Errorf("perf record: %w", err)
		}
		return nil
	case <-time.After(30 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
		return errors.New("perf record did not stop within 30s of SIGINT; killed")
	}
}
