// Package hubproc runs the real hub binary (`hub serve`) as a child
// process: the one launcher of the e2e tests, the demo and the benchmark.
// The hub logs the addresses its listeners got (the "hub listening" line,
// package listening): a caller that asks for port 0 never picks a port
// and then loses it to another process.
package hubproc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/hubmesh/hub/internal/listening"
)

// Options say how to run the hub.
type Options struct {
	Bin  string   // the hub binary
	Args []string // `serve` and its flags
	Env  []string // the whole environment; nil: this process's
	// LogPath receives the hub's output (the file is created, or
	// truncated).
	LogPath string
	// OwnGroup puts the hub in a process group of its own, so that a
	// terminal's Ctrl-C reaches only its parent, which stops it.
	OwnGroup bool
}

// Process is a running hub. It is killed (Pdeathsig) when the thread that
// started it exits: when its parent dies, killed or not.
type Process struct {
	opts Options
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
	err  error         // how it exited, set before done closes
}

// Start starts the hub; Listening waits for its listeners.
func Start(o Options) (*Process, error) {
	logFile, err := os.OpenFile(o.LogPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the hub's log: %w", err)
	}
	p := &Process{opts: o, done: make(chan struct{})}
	p.cmd = exec.Command(o.Bin, o.Args...)
	p.cmd.Env = o.Env
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: o.OwnGroup}
	if err := p.cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting the hub %s: %w", o.Bin, err)
	}
	go func() { // owned by the process: ends when it does
		p.err = p.cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// Listening waits until the hub has logged its listeners and returns their
// addresses by name (admin, xds, ...); it fails if the hub exits first or
// ctx ends.
func (p *Process) Listening(ctx context.Context) (map[string]string, error) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if addrs := listening.InFile(p.opts.LogPath); addrs != nil {
			return addrs, nil
		}
		select {
		case <-p.done:
			return nil, p.Exited()
		case <-ctx.Done():
			return nil, fmt.Errorf("the hub did not log its listeners: %w; log tail:\n%s", ctx.Err(), p.Tail(30))
		case <-tick.C:
		}
	}
}

// Done is closed when the hub has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited describes a hub that has exited (how, and the end of its log), or
// is nil while it runs.
func (p *Process) Exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("the hub exited (%v); the end of its log %s:\n%s", p.err, p.opts.LogPath, p.Tail(30))
	default:
		return nil
	}
}

// Err is how the hub exited; it is set once Done is closed.
func (p *Process) Err() error {
	<-p.done
	return p.err
}

// Signal sends the hub sig without waiting (Stop sends SIGTERM and waits).
func (p *Process) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// PID is the hub's process ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Kill kills the hub at once (SIGKILL) and waits for it to exit.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Stop sends SIGTERM, waits up to grace for the hub to exit (it drains its
// streams first), kills it after that, and returns how it exited: nil for
// a clean exit.
func (p *Process) Stop(grace time.Duration) error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-p.done:
		return p.err
	case <-timer.C:
		p.Kill()
		return fmt.Errorf("the hub did not stop within %s of SIGTERM", grace)
	}
}

// Restart starts the same binary with the same arguments and environment
// again, logging into logPath: a stopped hub restarted restores what it
// persisted, as any restarted hub does. Its listeners get new ports.
func (p *Process) Restart(logPath string) (*Process, error) {
	o := p.opts
	o.LogPath = logPath
	return Start(o)
}

// Args is the command line it runs, the binary first.
func (p *Process) Args() []string { return p.cmd.Args }

// LogPath is where the hub's output goes.
func (p *Process) LogPath() string { return p.opts.LogPath }

// Tail returns the last n lines of the hub's log.
func (p *Process) Tail(n int) string {
	data, err := os.ReadFile(p.opts.LogPath)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
