package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/hubmesh/hub/internal/listening"
)

// hubProcess is the hub binary running `hub serve` for the demo: the same
// server users deploy, as a child process whose output goes to its log.
type hubProcess struct {
	cmd       *exec.Cmd
	logPath   string
	listening chan map[string]string // its listeners' addresses by name, once
	done      chan struct{}          // closed when it has exited
	exitErr   error                  // set before done closes
}

// hubStopWait bounds how long the hub may take to stop after SIGTERM (it
// drains its xDS streams over --shutdown-grace, 10 s by default).
const hubStopWait = time.Minute

// startHub runs bin with args, its output appended to logPath. It dies with
// the demo (Pdeathsig) and is in a process group of its own: Ctrl-C
// reaches the demo, which stops it (stop).
func startHub(bin string, args []string, logPath string) (*hubProcess, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the hub's log: %w", err)
	}
	h := &hubProcess{logPath: logPath, listening: make(chan map[string]string, 1), done: make(chan struct{})}
	out := &listenWatch{w: logFile, found: h.listening}
	h.cmd = exec.Command(bin, args...)
	h.cmd.Stdout, h.cmd.Stderr = out, out
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := h.cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting the hub (%s; make demo builds it, or give --hub-bin): %w", bin, err)
	}
	go func() { // owned by the process: ends when it does
		h.exitErr = h.cmd.Wait()
		logFile.Close()
		close(h.done)
	}()
	return h, nil
}

// stop sends the hub SIGTERM, waits for it to exit (killing it after
// hubStopWait) and returns how it exited: nil for a clean exit.
func (h *hubProcess) stop() error {
	select {
	case <-h.done:
		return h.exitErr
	default:
	}
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.done:
		return h.exitErr
	case <-time.After(hubStopWait):
		_ = h.cmd.Process.Kill()
		<-h.done
		return fmt.Errorf("the hub did not stop within %s of SIGTERM", hubStopWait)
	}
}

// exited describes a hub that exited on its own: how, and the end of its
// log.
func (h *hubProcess) exited() error {
	data, _ := os.ReadFile(h.logPath)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	lines = lines[max(0, len(lines)-5):]
	return fmt.Errorf("the hub exited (%v); the end of its log %s:\n%s", h.exitErr, h.logPath, strings.Join(lines, "\n"))
}

// listenWatch writes the hub's output to w and sends the addresses of its
// JSON "hub listening" line to found (buffered, once). exec.Cmd calls
// Write from one goroutine at a time.
type listenWatch struct {
	w       io.Writer
	found   chan<- map[string]string
	partial []byte // the line being written, until the line is found
	sent    bool
}

func (l *listenWatch) Write(p []byte) (int, error) {
	if !l.sent {
		l.partial = append(l.partial, p...)
		for {
			line, rest, ok := bytes.Cut(l.partial, []byte("\n"))
			if !ok {
				break
			}
			l.partial = rest
			if addrs := listening.Addrs(line); addrs != nil {
				l.found <- addrs
				l.sent, l.partial = true, nil
				break
			}
		}
	}
	return l.w.Write(p)
}
