// Command adscclient runs Istio's own ADS client, istio.io/istio/pkg/adsc
// (SotW: adsc.New; Delta: adsc.NewDelta), against an xDS server over mTLS
// with a SPIFFE client certificate, and prints what it receives as one JSON
// object per line on stdout:
//
//	{"type":"cds","clusters":["outbound|80||x.ns.svc.cluster.local"]}
//	{"type":"eds","cluster":"outbound|80||…","endpoints":["198.18.0.1:8080"],"byMember":{"west":["198.18.0.1:8080"]}}
//	{"type":"sds","name":"kubernetes://gw-cert","kind":"tlsCertificate","certChain":"sha256:…","certs":["…"],"privateKey":true}
//	{"type":"sds","name":"ROOTCA","kind":"validationContext","trustedCA":"sha256:…","caCerts":["…"]}
//	{"type":"error","error":"…"}
//	{"type":"summary","complete":true,"received":[…],"missing":[]}
//
// Key material is never printed: certificate chains and CAs as the SHA-256
// of their bytes ("sha256:<hex>") and of each certificate's DER (hex),
// private keys only as whether one was present.
//
// It exits 0 once every watched resource has been received once, 2 when
// --timeout passes (or SIGTERM comes) first (the summary says what did and
// did not arrive), and 1 on errors. With --follow it keeps printing until
// killed (SIGTERM: summary, exit 0).
//
// Watches (--watch, comma separated): "cds" (wildcard CDS), "eds:<cluster>",
// "sds:<name>"; bare names are recognised too: "outbound|…"/"inbound|…" are
// EDS, "kubernetes://…", "ROOTCA", "spiffe://…" and "…-cacert" are SDS.
//
// adsc's own TLS setup (Config.CertDir / XDSRootCAFile) presents the client
// certificate but checks the server by host name (tls.Config.ServerName);
// an SVID carries its identity in a URI SAN, which Go's host name check
// ignores. So the connection is made with Config.GrpcOpts and transport
// credentials that present --cert/--key like adsc's CertDir does and verify
// the server's chain against --ca and its URI SAN against --server-spiffe-id.
// With --plaintext it connects without TLS instead (istiod's plaintext xDS
// port, as a sidecar in the istiod tests).
package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"istio.io/istio/pilot/pkg/model"
	v3 "istio.io/istio/pilot/pkg/xds/v3"
	"istio.io/istio/pkg/adsc"
	istiolog "istio.io/istio/pkg/log"
)

// Exit codes.
const (
	exitComplete   = 0
	exitError      = 1
	exitIncomplete = 2 // --timeout passed (or a signal came) before every watched resource arrived
)

func main() {
	os.Exit(run())
}

type options struct {
	addr, cert, key, ca, serverID string
	delta, follow, plaintext      bool
	nodeID, clusterID, namespace  string
	network                       string
	watch                         string
	timeout                       time.Duration
	logLevel                      string
}

func run() int {
	o := parseFlags()
	out := newPrinter()
	if err := configureLog(o.logLevel); err != nil {
		return out.fail(fmt.Errorf("configuring istio log: %w", err))
	}

	w, err := parseWatches(o.watch)
	if err != nil {
		return out.fail(err)
	}
	cfg, tlsErr, err := adscConfig(o)
	if err != nil {
		return out.fail(err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	events := make(chan event, 256)
	if o.delta {
		runDelta(ctx, o.addr, cfg, w, events)
	} else if err := runSotW(ctx, o.addr, cfg, w, events); err != nil {
		return out.fail(err)
	}

	want := w.keys()
	received := map[string]bool{}
	var deadline <-chan time.Time
	if !o.follow {
		deadline = time.After(o.timeout)
	}
	summary := func(complete bool) {
		var got, missing []string
		for k := range received {
			got = append(got, k)
		}
		for _, k := range want {
			if !received[k] {
				missing = append(missing, k)
			}
		}
		sort.Strings(got)
		out.print(map[string]any{"type": "summary", "complete": complete, "received": nonNil(got), "missing": nonNil(missing)})
	}
	for {
		select {
		case ev := <-events:
			if ev.line != nil {
				out.print(ev.line)
			}
			if ev.err != nil {
				summary(false)
				if err := tlsErr(); err != nil {
					ev.err = fmt.Errorf("%w; last TLS handshake error: %v", ev.err, err)
				}
				return out.fail(ev.err)
			}
			for _, k := range ev.keys {
				received[k] = true
			}
			if !o.follow && all(want, received) {
				summary(true)
				return exitComplete
			}
		case <-deadline:
			summary(false)
			return exitIncomplete
		case <-ctx.Done(): // SIGINT/SIGTERM
			complete := all(want, received)
			summary(complete)
			if complete || o.follow {
				return exitComplete
			}
			return exitIncomplete
		}
	}
}

// parseFlags reads the command line.
func parseFlags() options {
	var o options
	flag.StringVar(&o.addr, "addr", "", "xDS server host:port (mTLS, or plaintext with --plaintext)")
	flag.BoolVar(&o.plaintext, "plaintext", false, "connect without TLS (e.g. to istiod's plaintext xDS port); --cert, --key, --ca and --server-spiffe-id are then not used")
	flag.StringVar(&o.cert, "cert", "", "PEM file: client X.509-SVID chain (leaf first)")
	flag.StringVar(&o.key, "key", "", "PEM file: the SVID's private key")
	flag.StringVar(&o.ca, "ca", "", "PEM file: trust bundle roots that verify the server")
	flag.StringVar(&o.serverID, "server-spiffe-id", "", "the server's SPIFFE ID, e.g. spiffe://<td>/hub (checked against its URI SAN)")
	flag.BoolVar(&o.delta, "delta", false, "use Delta xDS (adsc.NewDelta) instead of SotW (adsc.New)")
	flag.StringVar(&o.nodeID, "node-id", "", "node ID in Istio's form <type>~<ip>~<workload>.<ns>~<ns>.svc.cluster.local (adsc builds the ID from these parts); empty: adsc's default")
	flag.StringVar(&o.clusterID, "cluster-id", "", "member cluster, sent as node metadata CLUSTER_ID")
	flag.StringVar(&o.network, "network", "", "the proxy's Istio network, sent as node metadata NETWORK (as istio-agent sends ISTIO_META_NETWORK)")
	flag.StringVar(&o.namespace, "namespace", "", "proxy namespace (node metadata NAMESPACE); default from --node-id, else adsc's default")
	flag.StringVar(&o.watch, "watch", "cds", "comma-separated watches: cds, eds:<cluster>, sds:<name> (bare names are classified)")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Second, "give up waiting for the watched resources after this long (exit 2 with a summary)")
	flag.BoolVar(&o.follow, "follow", false, "keep running and printing updates until killed")
	flag.StringVar(&o.logLevel, "log-level", "info", "level of adsc's own log on stderr (debug, info, warn, error, none)")
	flag.Parse()
	return o

}

// configureLog sends Istio's log (stdout by default: stdout carries our
// JSON) to stderr at level, adsc's own scopes too.
func configureLog(level string) error {
	lo := istiolog.DefaultOptions()
	lo.OutputPaths, lo.ErrorOutputPaths = []string{"stderr"}, []string{"stderr"}
	lo.SetDefaultOutputLevel(istiolog.DefaultScopeName, istiolog.StringToLevel(level))
	lo.SetDefaultOutputLevel("adsc", istiolog.StringToLevel(level))
	lo.SetDefaultOutputLevel("deltaadsc", istiolog.StringToLevel(level))
	return istiolog.Configure(lo)
}

// adscConfig turns the flags into adsc's Config: node identity and metadata,
// and mTLS through GrpcOpts (see the package comment for why not CertDir).
// tlsErr returns the last failed server verification, if any.
func adscConfig(o options) (cfg adsc.Config, tlsErr func() error, err error) {
	if o.addr == "" {
		return cfg, nil, errors.New("--addr is required")
	}
	if o.plaintext {
		if o.cert != "" || o.key != "" || o.ca != "" || o.serverID != "" {
			return cfg, nil, errors.New("--plaintext takes no --cert, --key, --ca or --server-spiffe-id")
		}
	} else if o.cert == "" || o.key == "" || o.ca == "" || o.serverID == "" {
		return cfg, nil, errors.New("--cert, --key, --ca and --server-spiffe-id are required (mTLS), unless --plaintext")
	}
	if o.nodeID != "" {
		nt, ip, workload, ns, err := parseNodeID(o.nodeID)
		if err != nil {
			return cfg, nil, err
		}
		if o.namespace != "" && o.namespace != ns {
			return cfg, nil, fmt.Errorf("--namespace %q differs from the namespace %q in --node-id", o.namespace, ns)
		}
		cfg.NodeType, cfg.IP, cfg.Workload, cfg.Namespace = model.NodeType(nt), ip, workload, ns
	} else if o.namespace != "" {
		cfg.Namespace = o.namespace
	}
	meta := map[string]any{}
	if o.clusterID != "" {
		meta["CLUSTER_ID"] = o.clusterID
	}
	if o.network != "" {
		meta["NETWORK"] = o.network
	}
	if cfg.Namespace != "" {
		meta["NAMESPACE"] = cfg.Namespace
	}
	s, err := structpb.NewStruct(meta)
	if err != nil {
		return cfg, nil, err
	}
	cfg.Meta = s
	cfg.ClientName = "adscclient"
	if o.plaintext {
		cfg.GrpcOpts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		return cfg, func() error { return nil }, nil
	}
	tlsCfg, tlsErr, err := clientTLS(o.cert, o.key, o.ca, o.serverID)
	if err != nil {
		return cfg, nil, err
	}
	cfg.GrpcOpts = []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg))}
	return cfg, tlsErr, nil
}

// parseNodeID splits Istio's node ID <type>~<ip>~<workload>.<ns>~<ns>.svc.cluster.local
// into the parts adsc builds it from.
func parseNodeID(id string) (nodeType, ip, workload, ns string, err error) {
	parts := strings.Split(id, "~")
	bad := fmt.Errorf("--node-id %q: adsc builds node IDs as <type>~<ip>~<workload>.<ns>~<ns>.svc.cluster.local", id)
	if len(parts) != 4 {
		return "", "", "", "", bad
	}
	ns, ok := strings.CutSuffix(parts[3], ".svc.cluster.local")
	if !ok || ns == "" {
		return "", "", "", "", bad
	}
	workload, ok = strings.CutSuffix(parts[2], "."+ns)
	if !ok || workload == "" {
		return "", "", "", "", bad
	}
	return parts[0], parts[1], workload, ns, nil
}

// clientTLS presents the SVID in certFile/keyFile (read at each handshake,
// as adsc's CertDir does) and accepts the server only if its chain verifies
// against the roots in caFile and its URI SAN is serverID. lastErr returns
// the last verification failure (adsc's Delta client only logs why its
// stream ended).
func clientTLS(certFile, keyFile, caFile, serverID string) (_ *tls.Config, lastErr func() error, _ error) {
	if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
		return nil, nil, fmt.Errorf("client certificate: %w", err)
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, nil, fmt.Errorf("%s holds no PEM certificates", caFile)
	}
	if !strings.HasPrefix(serverID, "spiffe://") {
		return nil, nil, fmt.Errorf("--server-spiffe-id %q is not a SPIFFE ID", serverID)
	}
	var mu sync.Mutex
	var last error
	fail := func(err error) error {
		mu.Lock()
		defer mu.Unlock()
		last = err
		return err
	}
	lastErr = func() error {
		mu.Lock()
		defer mu.Unlock()
		return last
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(certFile, keyFile)
			return &c, err
		},
		// The default verification checks DNS/IP SANs against ServerName;
		// an SVID has a URI SAN instead. VerifyConnection does the whole
		// check (chain, key usage, SPIFFE ID), also on resumed sessions.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fail(errors.New("server presented no certificate"))
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			leaf := cs.PeerCertificates[0]
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				return fail(fmt.Errorf("server certificate: %w", err))
			}
			if len(leaf.URIs) != 1 || leaf.URIs[0].String() != serverID {
				return fail(fmt.Errorf("server SPIFFE ID %v, want %s", leaf.URIs, serverID))
			}
			return nil
		},
	}, lastErr, nil
}

// watches is what to request.
type watches struct {
	cds      bool
	eds, sds []string
}

func parseWatches(s string) (watches, error) {
	var w watches
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		switch {
		case item == "":
		case item == "cds" || item == "cds:*":
			w.cds = true
		case strings.HasPrefix(item, "eds:"):
			w.eds = append(w.eds, strings.TrimPrefix(item, "eds:"))
		case strings.HasPrefix(item, "sds:"):
			w.sds = append(w.sds, strings.TrimPrefix(item, "sds:"))
		case strings.HasPrefix(item, "outbound|"), strings.HasPrefix(item, "inbound|"):
			w.eds = append(w.eds, item)
		case strings.HasPrefix(item, "kubernetes://"), strings.HasPrefix(item, "spiffe://"), item == "ROOTCA", strings.HasSuffix(item, "-cacert"):
			w.sds = append(w.sds, item)
		default:
			return w, fmt.Errorf("--watch %q: want cds, eds:<cluster> or sds:<name>", item)
		}
	}
	if !w.cds && len(w.eds) == 0 && len(w.sds) == 0 {
		return w, errors.New("--watch names nothing to request")
	}
	return w, nil
}

// keys are the completion keys of the watches: "cds", "eds:<name>", "sds:<name>".
func (w watches) keys() []string {
	var out []string
	if w.cds {
		out = append(out, "cds")
	}
	for _, n := range w.eds {
		out = append(out, "eds:"+n)
	}
	for _, n := range w.sds {
		out = append(out, "sds:"+n)
	}
	return out
}

// event is one thing that arrived: a line to print, the completion keys it
// satisfies, or the error that ended the stream.
type event struct {
	line map[string]any
	keys []string
	err  error
}

// runSotW starts adsc's SotW client. adsc itself requests EDS for every EDS
// cluster it gets over CDS (and then LDS); the initial requests add the
// explicitly watched EDS and SDS names.
func runSotW(ctx context.Context, addr string, cfg adsc.Config, w watches, events chan<- event) error {
	var reqs []*discoveryv3.DiscoveryRequest
	if w.cds {
		reqs = append(reqs, &discoveryv3.DiscoveryRequest{TypeUrl: v3.ClusterType})
	}
	if len(w.eds) > 0 {
		reqs = append(reqs, &discoveryv3.DiscoveryRequest{TypeUrl: v3.EndpointType, ResourceNames: w.eds})
	}
	if len(w.sds) > 0 {
		reqs = append(reqs, &discoveryv3.DiscoveryRequest{TypeUrl: v3.SecretType, ResourceNames: w.sds})
	}
	// No backoff policy: a broken stream ends the run instead of reconnecting.
	c, err := adsc.NewWithBackoffPolicy(addr, &adsc.ADSConfig{Config: cfg, InitialDiscoveryRequests: reqs, ResponseHandler: logResponses{}}, nil)
	if err != nil {
		return fmt.Errorf("adsc: %w", err)
	}
	if err := c.Run(); err != nil {
		return fmt.Errorf("adsc: opening the ADS stream to %s: %w", addr, err)
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				c.Close()
				return
			case msg := <-c.XDSUpdates:
				if msg == nil {
					events <- event{err: errors.New("adsc: the ADS stream closed (see its log on stderr)")}
					return
				}
				for _, ev := range sotwEvents(c, msg) {
					events <- ev
				}
			}
		}
	}()
	return nil
}

// sotwEvents reads what a response changed from adsc's state (clusters,
// endpoints) or, for types adsc keeps no state of (secrets), from the
// response adsc handed out.
func sotwEvents(c *adsc.ADSC, msg *discoveryv3.DiscoveryResponse) []event {
	switch msg.TypeUrl {
	case v3.ClusterType:
		var names []string
		for n := range c.GetEdsClusters() {
			names = append(names, n)
		}
		for n := range c.GetClusters() {
			names = append(names, n)
		}
		sort.Strings(names)
		return []event{{line: map[string]any{"type": "cds", "version": msg.VersionInfo, "clusters": nonNil(names)}, keys: []string{"cds"}}}
	case v3.EndpointType:
		var out []event
		eps := c.GetEndpoints()
		names := make([]string, 0, len(eps))
		for n := range eps {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			out = append(out, edsEvent(eps[n]))
		}
		return out
	case v3.SecretType:
		var out []event
		for _, r := range msg.Resources {
			s := &tlsv3.Secret{}
			if err := r.UnmarshalTo(s); err != nil {
				out = append(out, event{line: map[string]any{"type": "error", "error": fmt.Sprintf("decoding a secret: %v", err)}})
				continue
			}
			out = append(out, sdsEvent(s.GetName(), s))
		}
		if len(msg.Resources) == 0 {
			out = append(out, event{line: map[string]any{"type": "sds", "version": msg.VersionInfo, "empty": true}})
		}
		return out
	case v3.ListenerType:
		var names []string
		for n := range c.GetHTTPListeners() {
			names = append(names, n)
		}
		for n := range c.GetTCPListeners() {
			names = append(names, n)
		}
		sort.Strings(names)
		return []event{{line: map[string]any{"type": "lds", "resources": len(msg.Resources), "listeners": nonNil(names)}}}
	}
	return []event{{line: map[string]any{"type": "other", "typeUrl": msg.TypeUrl, "resources": len(msg.Resources)}}}
}

// logResponses is adsc's ResponseHandler: it logs every response on stderr.
type logResponses struct{}

func (logResponses) HandleResponse(_ *adsc.ADSC, r *discoveryv3.DiscoveryResponse) {
	fmt.Fprintf(os.Stderr, "adscclient: response type=%s version=%s nonce=%s resources=%d\n", r.TypeUrl, r.VersionInfo, r.Nonce, len(r.Resources))
}

// runDelta starts adsc's Delta client with handlers per type; a CDS handler
// registers each EDS cluster's endpoints as a dependency, as Envoy would.
func runDelta(ctx context.Context, addr string, cfg adsc.Config, w watches, events chan<- event) {
	opts := []adsc.Option{
		adsc.Register(func(hc adsc.HandlerContext, name, version string, c *clusterv3.Cluster, ev adsc.Event) {
			events <- event{line: map[string]any{"type": "cds", "event": ev.String(), "version": version, "clusters": []string{name}}, keys: []string{"cds"}}
			if ev == adsc.EventAdd && c.GetType() == clusterv3.Cluster_EDS {
				n := c.GetEdsClusterConfig().GetServiceName()
				if n == "" {
					n = c.GetName()
				}
				hc.RegisterDependency(v3.EndpointType, n)
			}
		}),
		adsc.Register(func(_ adsc.HandlerContext, name, version string, cla *endpointv3.ClusterLoadAssignment, ev adsc.Event) {
			if ev == adsc.EventDelete {
				events <- event{line: map[string]any{"type": "eds", "event": "delete", "cluster": name}}
				return
			}
			events <- edsEvent(cla)
		}),
		adsc.Register(func(_ adsc.HandlerContext, name, version string, s *tlsv3.Secret, ev adsc.Event) {
			if ev == adsc.EventDelete {
				events <- event{line: map[string]any{"type": "sds", "event": "delete", "name": name}}
				return
			}
			events <- sdsEvent(name, s)
		}),
	}
	if w.cds {
		opts = append(opts, adsc.Watch[*clusterv3.Cluster]("*"))
	}
	for _, n := range w.eds {
		opts = append(opts, adsc.Watch[*endpointv3.ClusterLoadAssignment](n))
	}
	for _, n := range w.sds {
		opts = append(opts, adsc.Watch[*tlsv3.Secret](n))
	}
	// No backoff policy: a broken stream ends Run instead of reconnecting.
	c := adsc.NewDeltaWithBackoffPolicy(addr, &adsc.DeltaADSConfig{Config: cfg}, nil, opts...)
	go func() {
		c.Run(ctx)
		if ctx.Err() == nil {
			events <- event{err: errors.New("adsc: the delta ADS stream closed (see its log on stderr)")}
		}
	}()
	go func() {
		select {
		case <-c.Synced():
			// adsc saw a response for every initial watch (for the CDS
			// wildcard: any CDS response, also an empty one).
			var keys []string
			if w.cds {
				keys = append(keys, "cds")
			}
			events <- event{line: map[string]any{"type": "synced"}, keys: keys}
		case <-ctx.Done():
		}
	}()
}

func edsEvent(cla *endpointv3.ClusterLoadAssignment) event {
	var all, mtls []string
	byMember := map[string][]string{}
	weights := map[string]uint32{}
	priorities := map[string]uint32{}
	for _, loc := range cla.GetEndpoints() {
		for _, lb := range loc.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			a := fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue())
			all = append(all, a)
			weights[a] += max(lb.GetLoadBalancingWeight().GetValue(), 1)
			priorities[a] = loc.GetPriority()
			if lb.GetMetadata().GetFilterMetadata()["envoy.transport_socket_match"].GetFields()["tlsMode"].GetStringValue() == "istio" {
				mtls = append(mtls, a)
			}
			if m := lb.GetMetadata().GetFilterMetadata()["hub"].GetFields()["cluster"].GetStringValue(); m != "" {
				byMember[m] = append(byMember[m], a)
			}
		}
	}
	sort.Strings(all)
	for _, v := range byMember {
		slices.Sort(v)
	}
	sort.Strings(mtls)
	return event{line: map[string]any{"type": "eds", "cluster": cla.GetClusterName(), "endpoints": nonNil(all), "byMember": byMember,
		"weights": weights, "priorities": priorities, "mtls": nonNil(mtls)},
		keys: []string{"eds:" + cla.GetClusterName()}}
}

// sdsEvent describes a secret without its key material.
func sdsEvent(name string, s *tlsv3.Secret) event {
	line := map[string]any{"type": "sds", "name": name}
	switch {
	case s.GetTlsCertificate() != nil:
		tc := s.GetTlsCertificate()
		line["kind"] = "tlsCertificate"
		line["certChain"] = hash(tc.GetCertificateChain().GetInlineBytes())
		line["certs"] = fingerprints(tc.GetCertificateChain().GetInlineBytes())
		line["privateKey"] = len(tc.GetPrivateKey().GetInlineBytes()) > 0 || tc.GetPrivateKey().GetFilename() != ""
	case s.GetValidationContext() != nil:
		line["kind"] = "validationContext"
		line["trustedCA"] = hash(s.GetValidationContext().GetTrustedCa().GetInlineBytes())
		line["caCerts"] = fingerprints(s.GetValidationContext().GetTrustedCa().GetInlineBytes())
	default:
		line["kind"] = "other"
	}
	return event{line: line, keys: []string{"sds:" + name}}
}

func hash(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// fingerprints lists the lowercase hex SHA-256 of the DER bytes of each
// certificate in a PEM bundle.
func fingerprints(pemBytes []byte) []string {
	out := []string{}
	for {
		var b *pem.Block
		b, pemBytes = pem.Decode(pemBytes)
		if b == nil {
			return out
		}
		if b.Type == "CERTIFICATE" {
			sum := sha256.Sum256(b.Bytes)
			out = append(out, hex.EncodeToString(sum[:]))
		}
	}
}

func all(want []string, got map[string]bool) bool {
	for _, k := range want {
		if !got[k] {
			return false
		}
	}
	return true
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// printer writes JSON lines to stdout.
type printer struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func newPrinter() *printer { return &printer{enc: json.NewEncoder(os.Stdout)} }

func (p *printer) print(v map[string]any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.enc.Encode(v)
}

func (p *printer) fail(err error) int {
	p.print(map[string]any{"type": "error", "error": err.Error()})
	return exitError
}
