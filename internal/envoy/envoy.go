// Package envoy runs real Envoy processes (the PyPI build of upstream Envoy,
// see internal/tools/envoy/install.sh) for tests, the demo and benchmarks,
// and reads what they hold from their admin API.
//
// It does not import testing (envoytest.go's helpers take a testing.TB but
// need nothing else), so cmd/hubbench and the demo can use it too.
package envoy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
)

// BinEnv names the environment variable that holds the Envoy binary's path.
const BinEnv = "HUB_ENVOY_BIN"

// Version is the Envoy release internal/tools/envoy/install.sh pins.
const Version = "1.40.0"

// logTailLines is how much of an Envoy's log its errors quote.
const logTailLines = 40

// Binary returns the Envoy binary named by $HUB_ENVOY_BIN.
func Binary() (string, error) {
	bin := os.Getenv(BinEnv)
	if bin == "" {
		return "", fmt.Errorf("%s is not set: run `export %s=$(internal/tools/envoy/install.sh)` (or make test, which sets it)", BinEnv, BinEnv)
	}
	fi, err := os.Stat(bin)
	if err != nil {
		return "", fmt.Errorf("%s=%s: %w; run internal/tools/envoy/install.sh (or make test) to fetch Envoy %s", BinEnv, bin, err, Version)
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("%s=%s is not an executable file; run internal/tools/envoy/install.sh (or make test) to fetch Envoy %s", BinEnv, bin, Version)
	}
	return bin, nil
}

// Options says how to run one Envoy.
type Options struct {
	// Bin is the Envoy binary; empty means Binary().
	Bin string
	// Bootstrap is the bootstrap config, JSON or YAML (see ADS, Marshal).
	// Its admin must listen on 127.0.0.1 port 0 (LoopbackAdmin): Start
	// learns the port from the admin address file.
	Bootstrap []byte
	// Dir is the work directory (required, created if missing): the
	// bootstrap file, envoy.log (Envoy's log, stdout and stderr) and the
	// admin address file go there.
	Dir string
	// Args are extra command-line arguments, after the ones Start sets
	// (-l and --concurrency in Args replace Start's).
	Args []string
	// ID, when set, is the node ID (--service-node), overriding the
	// bootstrap's node.id.
	ID string
	// Netns, when set, runs Envoy in that named network namespace (`ip
	// netns exec`, so as root); the admin readers then dial into it.
	Netns string
}

// Process is a running (or exited) Envoy.
type Process struct {
	cmd       *exec.Cmd
	dir       string
	logPath   string
	netns     string
	*AdminAPI // set once the admin API listens

	exited  chan struct{}
	waitErr error // set before exited is closed

	stopOnce sync.Once
	stopErr  error
}

// Start writes o.Bootstrap into o.Dir and starts Envoy on it, returning once
// its admin API listens (not once it is ready: an Envoy that never gets its
// config is still a valid process; see WaitReady). ctx bounds only that
// wait, not the process, which runs until Stop. If Envoy exits or ctx ends
// first, Start kills it and the error quotes the end of its log.
func Start(ctx context.Context, o Options) (*Process, error) {
	bin := o.Bin
	if bin == "" {
		var err error
		if bin, err = Binary(); err != nil {
			return nil, err
		}
	}
	if o.Dir == "" {
		return nil, errors.New("envoy: Options.Dir is empty")
	}
	if len(bytes.TrimSpace(o.Bootstrap)) == 0 {
		return nil, errors.New("envoy: Options.Bootstrap is empty")
	}
	dir, cfg, adminPath, err := prepareDir(o)
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "envoy.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own descriptor

	name, args := commandLine(bin, o, cfg, adminPath, logPath)
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr()
	if err := onSpawnThread(cmd.Start); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	p := &Process{
		cmd:     cmd,
		dir:     dir,
		logPath: logPath,
		netns:   o.Netns,
		exited:  make(chan struct{}),
	}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()

	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if addr := readAdminAddress(adminPath); addr != "" {
			p.AdminAPI = NewAdminAPI("http://"+addr, o.Netns)
			return p, nil
		}
		select {
		case <-p.exited:
			return nil, p.failure(fmt.Sprintf("envoy exited before its admin API listened (%v)", p.waitErr))
		case <-ctx.Done():
			p.kill()
			return nil, p.failure(fmt.Sprintf("envoy's admin API did not listen before %v", context.Cause(ctx)))
		case <-tick.C:
		}
	}
}

// prepareDir makes o.Dir (absolute), writes o.Bootstrap into it and
// clears the admin address file a previous Envoy left; it returns the
// directory, the bootstrap's path and the admin address file's.
func prepareDir(o Options) (dir, cfg, adminPath string, err error) {
	if dir, err = filepath.Abs(o.Dir); err != nil {
		return "", "", "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", "", err
	}
	// Envoy picks the parser by the file's extension.
	cfg = filepath.Join(dir, "bootstrap.yaml")
	if bytes.HasPrefix(bytes.TrimSpace(o.Bootstrap), []byte("{")) {
		cfg = filepath.Join(dir, "bootstrap.json")
	}
	if err := os.WriteFile(cfg, o.Bootstrap, 0o644); err != nil {
		return "", "", "", err
	}
	adminPath = filepath.Join(dir, "admin")
	if err := os.Remove(adminPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", "", "", err
	}
	return dir, cfg, adminPath, nil
}

// commandLine is the program and arguments that run Envoy bin on cfg: one
// worker thread and info logs unless o.Args say otherwise, inside o.Netns
// when set.
func commandLine(bin string, o Options, cfg, adminPath, logPath string) (string, []string) {
	args := []string{"-c", cfg, "--disable-hot-restart", "--use-dynamic-base-id",
		"--admin-address-path", adminPath, "--log-path", logPath}
	if !hasFlag(o.Args, "--concurrency") {
		args = append(args, "--concurrency", "1")
	}
	if !hasFlag(o.Args, "-l", "--log-level") {
		args = append(args, "-l", "info")
	}
	if o.ID != "" {
		args = append(args, "--service-node", o.ID)
	}
	args = append(args, o.Args...)
	if o.Netns != "" {
		return "ip", append([]string{"netns", "exec", o.Netns, bin}, args...)
	}
	return bin, args
}

// hasFlag reports whether args set one of the flags (as "-f v" or "-f=v").
func hasFlag(args []string, flags ...string) bool {
	for _, a := range args {
		for _, f := range flags {
			if a == f || strings.HasPrefix(a, f+"=") {
				return true
			}
		}
	}
	return false
}

// readAdminAddress returns the admin address Envoy wrote, or "" while the
// file is missing or not yet a whole host:port.
func readAdminAddress(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	addr := strings.TrimSpace(string(b))
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" || port == "0" {
		return ""
	}
	return addr
}

// Admin returns the admin API's base URL, e.g. http://127.0.0.1:40123.
func (p *Process) Admin() string { return p.URL() }

// Dir returns the process's work directory.
func (p *Process) Dir() string { return p.dir }

// PID returns the process ID (Envoy's own, also under Netns: `ip netns
// exec` execs it).
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited (and been reaped).
func (p *Process) Done() <-chan struct{} { return p.exited }

// Log returns Envoy's log (with its stdout and stderr).
func (p *Process) Log() (string, error) {
	b, err := os.ReadFile(p.logPath)
	return string(b), err
}

// LogTail returns the last n lines of Envoy's log, or a note saying why
// there are none.
func (p *Process) LogTail(n int) string {
	s, err := p.Log()
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return "(empty log)"
	}
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// failure is an error saying what went wrong, quoting the log's end.
func (p *Process) failure(what string) error {
	return fmt.Errorf("%s; last lines of %s:\n%s", what, p.logPath, p.LogTail(logTailLines))
}

// WaitReady polls the admin API until GET /ready answers 200 (Envoy is
// LIVE: its initial config arrived, or timed out) or ctx ends.
func (p *Process) WaitReady(ctx context.Context) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	last := "no answer yet"
	for {
		status, body, err := p.do(ctx, http.MethodGet, "/ready")
		switch {
		case err == nil && status == http.StatusOK:
			return nil
		case err == nil:
			last = fmt.Sprintf("%d %s", status, strings.TrimSpace(string(body)))
		case ctx.Err() == nil:
			last = err.Error()
		}
		select {
		case <-p.exited:
			return p.failure(fmt.Sprintf("envoy exited before it was ready (%v)", p.waitErr))
		case <-ctx.Done():
			return p.failure(fmt.Sprintf("envoy not ready before %v (GET /ready: %s)", context.Cause(ctx), last))
		case <-tick.C:
		}
	}
}

// Stop asks Envoy to exit (POST /quitquitquit), kills it if it has not
// exited 3 s later, and reaps it. It is idempotent and returns the same
// error each time: nil when Envoy exited cleanly on request, otherwise what
// happened, with the end of its log.
func (p *Process) Stop() error {
	p.stopOnce.Do(func() { p.stopErr = p.stop() })
	return p.stopErr
}

func (p *Process) stop() error {
	defer p.client.CloseIdleConnections()
	select {
	case <-p.exited:
		return p.failure(fmt.Sprintf("envoy had already exited (%v)", p.waitErr))
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, _, _ = p.do(ctx, http.MethodPost, "/quitquitquit")
	cancel()
	t := time.NewTimer(3 * time.Second)
	defer t.Stop()
	select {
	case <-p.exited:
		if p.waitErr != nil {
			return p.failure(fmt.Sprintf("envoy exited on /quitquitquit with %v", p.waitErr))
		}
		return nil
	case <-t.C:
	}
	p.kill()
	return p.failure("envoy did not exit within 3s of /quitquitquit; killed it")
}

// kill kills the process and waits until it is reaped.
func (p *Process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// spawn is the OS thread every Envoy is forked from. Envoys get Pdeathsig
// (they die with us), which Linux sends when the forking *thread* exits,
// and a Go thread exits when a goroutine ends locked to it: this one stays
// locked and alive for the life of the process.
var spawn struct {
	once sync.Once
	fns  chan func()
}

func onSpawnThread(f func() error) error {
	spawn.once.Do(func() {
		spawn.fns = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives on
			for fn := range spawn.fns {
				fn()
			}
		}()
	})
	errc := make(chan error, 1)
	spawn.fns <- func() { errc <- f() }
	return <-errc
}
