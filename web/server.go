package web

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// ServerOptions configure the admin HTTP server. Zero durations take the
// defaults below.
type ServerOptions struct {
	// TLSCertFile and TLSKeyFile, both or neither, serve the admin port
	// over TLS; the dashboard's session cookie is then Secure (it is on
	// every request that came over TLS). The pair is read again
	// when either file changes (checked at most once a second, on a
	// handshake); a changed pair that does not load keeps the last good one.
	TLSCertFile, TLSKeyFile string
	// ReadHeaderTimeout bounds reading a request's headers (default 10s):
	// a client dribbling headers is cut off.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included (default
	// 30s; bodies are at most 1 MiB).
	ReadTimeout time.Duration
	// WriteTimeout bounds handling a request and writing its response
	// (default 60s). The dashboard's live stream lifts it for itself and
	// bounds each of its writes instead.
	WriteTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle this long (default 2m).
	IdleTimeout time.Duration
	Log         *slog.Logger
}

// Server is the admin HTTP(S) server. It serves one handler, which cmd/hub
// composes of the REST API, health and metrics (package api) and the
// Dashboard; it lives here because its one browser-facing user is the
// dashboard (Secure cookies, a live stream outliving WriteTimeout, streams
// ended on shutdown), with which it is tested.
type Server struct {
	http *http.Server
	tls  bool
}

// NewServer builds the admin server for h. Every response gets security
// headers with baselineCSP, which the Dashboard replaces with its own.
func NewServer(h http.Handler, opts ServerOptions) (*Server, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	s := &Server{}
	var tlsCfg *tls.Config
	switch {
	case opts.TLSCertFile != "" && opts.TLSKeyFile != "":
		kp, err := loadKeyPair(opts.TLSCertFile, opts.TLSKeyFile, opts.Log)
		if err != nil {
			return nil, err
		}
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: kp.get}
		s.tls = true
	case opts.TLSCertFile != "" || opts.TLSKeyFile != "":
		return nil, errors.New("admin TLS needs both a certificate and a key file")
	}
	s.http = &http.Server{
		Handler:           securityHeaders(baselineCSP, h),
		TLSConfig:         tlsCfg,
		ReadHeaderTimeout: orDefault(opts.ReadHeaderTimeout, 10*time.Second),
		ReadTimeout:       orDefault(opts.ReadTimeout, 30*time.Second),
		WriteTimeout:      orDefault(opts.WriteTimeout, 60*time.Second),
		IdleTimeout:       orDefault(opts.IdleTimeout, 2*time.Minute),
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(opts.Log.Handler(), slog.LevelDebug),
	}
	return s, nil
}

// baselineCSP lets a response load nothing and be framed nowhere: health,
// metrics and API answers are never pages. The Dashboard sets pageCSP over
// it.
const baselineCSP = "default-src 'none'; frame-ancestors 'none'"

// RegisterOnShutdown calls f when the server starts shutting down (see
// Serve); give it Dashboard.Shutdown so that live streams end at once.
func (s *Server) RegisterOnShutdown(f func()) { s.http.RegisterOnShutdown(f) }

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// TLS reports whether the server serves over TLS.
func (s *Server) TLS() bool { return s.tls }

// Serve serves on lis until ctx is done, then shuts down: live streams end
// at once, other requests get 5 seconds to finish. It returns once the
// server has stopped.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	returned := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-ctx.Done():
		case <-returned: // Serve failed on its own
			return
		}
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.http.Shutdown(shutdownCtx); err != nil {
			_ = s.http.Close()
		}
	}()
	var err error
	if s.tls {
		err = s.http.ServeTLS(lis, "", "")
	} else {
		err = s.http.Serve(lis)
	}
	close(returned)
	<-stopped
	if !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving the admin port on %s: %w", lis.Addr(), err)
	}
	return nil
}

// keyPair is a TLS certificate and key read from files, read again when
// they change.
type keyPair struct {
	certFile, keyFile string
	log               *slog.Logger

	mu      sync.Mutex // held over two small file reads at most, never the network
	cert    *tls.Certificate
	sum     [32]byte
	checked time.Time
}

func loadKeyPair(certFile, keyFile string, log *slog.Logger) (*keyPair, error) {
	kp := &keyPair{certFile: certFile, keyFile: keyFile, log: log}
	sum, cert, err := kp.read()
	if err != nil {
		return nil, err
	}
	kp.sum, kp.cert, kp.checked = sum, cert, time.Now()
	return kp, nil
}

func (kp *keyPair) read() ([32]byte, *tls.Certificate, error) {
	certPEM, err := os.ReadFile(kp.certFile)
	if err != nil {
		return [32]byte{}, nil, fmt.Errorf("reading the admin TLS certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(kp.keyFile)
	if err != nil {
		return [32]byte{}, nil, fmt.Errorf("reading the admin TLS key: %w", err)
	}
	h := sha256.New()
	h.Write(certPEM)
	h.Write([]byte{0})
	h.Write(keyPEM)
	var sum [32]byte
	h.Sum(sum[:0])
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return sum, nil, fmt.Errorf("loading the admin TLS key pair (%s, %s): %w", kp.certFile, kp.keyFile, err)
	}
	return sum, &cert, nil
}

// get is tls.Config.GetCertificate.
func (kp *keyPair) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	if now := time.Now(); now.Sub(kp.checked) >= time.Second {
		kp.checked = now
		sum, cert, err := kp.read()
		switch {
		case sum == kp.sum:
		case err != nil:
			kp.log.Warn("admin TLS key pair changed but does not load; keeping the last good one", "cert", kp.certFile, "key", kp.keyFile, "error", err)
		default:
			kp.sum, kp.cert = sum, cert
			kp.log.Info("admin TLS key pair reloaded", "cert", kp.certFile, "key", kp.keyFile)
		}
	}
	return kp.cert, nil
}
