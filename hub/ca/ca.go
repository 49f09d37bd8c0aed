// Package ca is Istio's CA API (docs/architecture.md §3.8): istio-agent sends a CSR
// to istio.v1.auth.IstioCertificateService/CreateCertificate on the hub's
// mTLS xDS port and gets the certificate of its workload identity. The
// caller proves who it is (hub/authn) with a client certificate of our
// trust domain bound to a member (renewal), else with a Kubernetes
// service-account token that the member named by its ClusterID header
// reviews. The certificate names exactly that identity, whatever the CSR
// asks for, and is bound to that member (trust.MemberOID), which SDS
// relies on. Requests are checked and signed on a bounded number of
// workers; what was issued and refused is kept as a read model (Stats) and
// as metrics.
package ca

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/hubmesh/hub/hub/authn"
	"github.com/hubmesh/hub/hub/internal/clip"
)

// WorkloadSigner signs workload certificates for Istio's CA API
// (trust.Domains implements it).
type WorkloadSigner interface {
	// SignWorkload signs pub for id, bound to member, valid for ttl (never
	// beyond the CA's own certificate), and returns the chain: the leaf
	// first, the root last.
	SignWorkload(pub crypto.PublicKey, id spiffeid.ID, member string, ttl time.Duration) ([]*x509.Certificate, error)
}

// Members tells which cluster IDs are in the federation now
// (clusters.Registry implements it).
type Members interface {
	// IsCluster reports whether id is the home cluster or a current member.
	IsCluster(id string) bool
}

// Workload certificate lifetimes. The default is istiod's and what
// istio-agent asks for unless SECRET_TTL says otherwise. The maximum is
// a week rather than istiod's 90 days: a certificate cannot be revoked,
// so the maximum is how long a leaked one stays good after its
// ServiceAccount is gone, and agents renew at half their lifetime anyway;
// a week still covers agents configured for multi-day certificates.
const (
	DefaultWorkloadCertTTL    = 24 * time.Hour
	DefaultMaxWorkloadCertTTL = 7 * 24 * time.Hour
)

// What a renewal may prove. A certificate proves its identity only until
// it expires, so a renewal by certificate rotates the key and ends no
// later than the certificate presented: a leaked certificate is good for
// at most its own lifetime, however often it renews. A token proves the
// account exists now, so the CA takes a token review at most
// caTokenMaxAge old (SDS takes any within a minute): an account deleted
// in its member stops getting certificates within that (plus the member
// API server's own token cache, 10 s in kube-apiserver), and the member's
// "no" also ends SDS's cached acceptance.
const caTokenMaxAge = 5 * time.Second

// maxCSRBytes bounds the CSR of one request (a PEM RSA-4096 CSR is ~1.7 KiB).
const maxCSRBytes = 64 << 10

// maxRSABits bounds an RSA CSR key, and its public exponent must be
// 65537 (what every RSA key generator in use, Go's and so istio-agent's
// included, makes): checking a signature costs more with every bit of
// either. An RSA-8192 CSR with the largest exponent Go accepts costs ~4 ms
// of CPU to check, 120 times an RSA-2048 one; RSA-4096 with 65537 costs
// well under a millisecond. istio-agent makes RSA-2048 keys (or ECDSA
// P-256) unless told otherwise; 4096 bits is the largest that Istio's own
// key options offer.
const (
	maxRSABits     = 4096
	rsaExponent    = 65537
	minRSABits     = 2048
	caQueuePerSlot = 64 // requests that may wait, per worker slot
)

// caWorkers bounds the requests whose CSR is checked and signed at once
// (one per core: with the key limits above each is short, and a push is
// not starved for long), caRenewalWorkers more slots only renewals by
// certificate may take: a flood of token-authenticated requests (new
// workloads, or one caller with many tokens) cannot hold up the renewals
// that keep the running fleet's certificates valid. At most caQueuePerSlot
// requests per slot wait; the next are refused with ResourceExhausted
// (istio-agent retries with backoff) rather than piling up goroutines.
var (
	caWorkers        = max(1, runtime.GOMAXPROCS(0))
	caRenewalWorkers = max(1, runtime.GOMAXPROCS(0)/2)
)

// Server is Istio's IstioCertificateService, for the hub's mTLS listener
// only.
type Server struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer
	signer     WorkloadSigner
	roots      authn.RootSource
	tokens     *authn.TokenAuth // nil: tokens are not accepted
	defaultTTL time.Duration
	maxTTL     time.Duration
	members    Members // nil: every member a credential proves is taken as current
	stats      *caStats
	log        *slog.Logger
	scope      *authn.Scope  // nil: any identity a credential proves
	workers    chan struct{} // a slot per request being checked and signed (caWorkers)
	renewals   chan struct{} // more slots for renewals by certificate (caRenewalWorkers)
	waiting    atomic.Int64  // requests waiting for a slot
	maxWaiting int64
}

// Options configures a Server.
type Options struct {
	// Signer signs the workload certificates.
	Signer WorkloadSigner
	// Roots are our trust domain's roots: only a certificate that chains
	// to them renews itself.
	Roots authn.RootSource
	// Tokens authenticates callers without a client certificate; nil
	// accepts no token.
	Tokens *authn.TokenAuth
	// Scope tells which identities each member may assert; nil: any
	// identity a credential proves.
	Scope *authn.Scope
	// Members tells which members are in the federation; nil: every member
	// a credential proves is taken as current.
	Members Members
	// MaxTTL is the longest certificate issued; a longer request is refused
	// with InvalidArgument. Zero means DefaultMaxWorkloadCertTTL.
	MaxTTL time.Duration
	// Log is the logger.
	Log *slog.Logger
}

// New returns a Server with opts (it needs Signer, Roots and Log).
func New(opts Options) *Server {
	maxTTL := opts.MaxTTL
	if maxTTL <= 0 {
		maxTTL = DefaultMaxWorkloadCertTTL
	}
	return &Server{signer: opts.Signer, roots: opts.Roots, tokens: opts.Tokens, members: opts.Members, scope: opts.Scope,
		defaultTTL: min(DefaultWorkloadCertTTL, maxTTL), maxTTL: maxTTL, stats: newCAStats(), log: opts.Log,
		workers: make(chan struct{}, caWorkers), renewals: make(chan struct{}, caRenewalWorkers),
		maxWaiting: int64(caQueuePerSlot * (caWorkers + caRenewalWorkers))}
}

// Stats summarises the workload certificates the server issued and the
// requests it refused, with the lifetimes it issues.
func (s *Server) Stats() CertificateStats {
	st := s.stats.snapshot()
	st.DefaultTTL, st.MaxTTL = s.defaultTTL, s.maxTTL
	return st
}

// Collectors are the CA's metrics: hub_ca_certificates_issued_total,
// hub_ca_requests_failed_total and hub_ca_issue_seconds.
func (s *Server) Collectors() []prometheus.Collector { return s.stats.collectors() }

// Workers is how many requests, token-authenticated or not, the server
// checks and signs at once (renewals by certificate may take a few more
// slots of their own).
func (s *Server) Workers() int { return cap(s.workers) }

// Waiting is how many requests wait for a worker now.
func (s *Server) Waiting() int { return int(s.waiting.Load()) }

// DisableRenewalLane takes away the worker slots only renewals by
// certificate may take: renewals then wait for a worker with every other
// request, as they would without the lane (what the lane is worth under a
// flood: BenchmarkCARenewalUnderFlood). Call it before the server takes
// requests.
func (s *Server) DisableRenewalLane() {
	s.renewals = make(chan struct{}) // unbuffered, never received: no renewal slot
}

// caError is a refused request: its gRPC code, the metrics reason (one of
// the caReason* constants) and what the caller is told.
type caError struct {
	code   codes.Code
	reason string
	msg    string
}

func (e *caError) Error() string { return e.msg }

func refuse(code codes.Code, reason, format string, args ...any) *caError {
	return &caError{code: code, reason: reason, msg: fmt.Sprintf(format, args...)}
}

// Reasons a request is refused: the label values of
// hub_ca_requests_failed_total, a fixed set.
const (
	caReasonNoCredentials       = "no_credentials"       // neither a certificate nor a token, or a token without ClusterID
	caReasonTokenRejected       = "token_rejected"       // the member did not accept the token
	caReasonReviewUnavailable   = "review_unavailable"   // the member could not review the token in time (Unavailable)
	caReasonCertificateRejected = "certificate_rejected" // not a member-bound workload certificate of our trust domain
	caReasonClusterMismatch     = "cluster_mismatch"     // a certificate bound to one member, ClusterID naming another
	caReasonNotMember           = "not_member"           // the member a credential proves is no longer in the federation
	caReasonRateLimited         = "rate_limited"         // the caller's source sent too many rejected tokens (ResourceExhausted)
	caReasonOverloaded          = "overloaded"           // too many requests waiting for a worker (ResourceExhausted)
	// PermissionDenied: an identity its member may not assert (authn.Scope*).
	caReasonMemberNotSynced     = authn.ScopeMemberNotSynced
	caReasonHubNamespace        = authn.ScopeHubNamespace
	caReasonRootNamespace       = authn.ScopeRootNamespace
	caReasonNamespaceNotAllowed = authn.ScopeNamespaceNotAllowed
	caReasonInvalidCSR          = "invalid_csr"
	caReasonInvalidTTL          = "invalid_ttl"
	caReasonSigning             = "signing_failed" // Internal
)

// caReasons lists every reason, for the read model's stable order.
var caReasons = []string{caReasonNoCredentials, caReasonTokenRejected, caReasonReviewUnavailable, caReasonCertificateRejected,
	caReasonClusterMismatch, caReasonNotMember, caReasonRateLimited, caReasonOverloaded, caReasonMemberNotSynced,
	caReasonHubNamespace, caReasonRootNamespace, caReasonNamespaceNotAllowed, caReasonInvalidCSR, caReasonInvalidTTL, caReasonSigning}

// CreateCertificate signs the CSR's public key for the caller's
// authenticated identity if its member may assert it (authn.Scope).
// Errors are Unauthenticated (who the caller is), PermissionDenied (an
// identity its member may not assert), ResourceExhausted (rate limited or
// overloaded), Unavailable (the member did not answer), InvalidArgument
// (what it asked for) or Internal (signing); each is logged with the
// member, the identity when known and the reason, never with the token or
// the CSR.
func (s *Server) CreateCertificate(ctx context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	start := time.Now()
	id, claimed, err := s.authenticate(ctx)
	if err == nil && s.members != nil && !s.members.IsCluster(id.Cluster) {
		// A renewal, or a token reviewed before the member was removed.
		err = refuse(codes.Unauthenticated, caReasonNotMember,
			"member %s, which the credential of %s proves, is not in the federation (removed or invalid)", id.Cluster, id.SpiffeID)
	}
	if err == nil {
		err = s.inScope(id)
	}
	if err != nil {
		return nil, s.fail(ctx, id, claimed, err)
	}
	csr, err := parseCSR(req.GetCsr())
	if err != nil {
		return nil, s.fail(ctx, id, claimed, err)
	}
	release, err := s.acquire(ctx, !id.NotAfter.IsZero())
	if release != nil {
		defer release() // also when the caller gave up meanwhile: a slot is never lost
	}
	if ctx.Err() != nil {
		return nil, status.FromContextError(ctx.Err()).Err() // the caller gave up: not a refusal
	}
	if err != nil {
		return nil, s.fail(ctx, id, claimed, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, s.fail(ctx, id, claimed, refuse(codes.InvalidArgument, caReasonInvalidCSR, "the CSR's signature does not verify: %v", err))
	}
	pub := csr.PublicKey
	ttl, err := s.ttl(req.GetValidityDuration())
	if err != nil {
		return nil, s.fail(ctx, id, claimed, err)
	}
	if !id.NotAfter.IsZero() {
		// A renewal by certificate: never beyond it (X.509 keeps whole
		// seconds, truncated, so the new one ends at the same second).
		if ttl = min(ttl, time.Until(id.NotAfter)); ttl <= 0 {
			return nil, s.fail(ctx, id, claimed, refuse(codes.Unauthenticated, caReasonCertificateRejected,
				"the client certificate of %s has expired", id.SpiffeID))
		}
	}
	chain, err := s.signer.SignWorkload(pub, id.SpiffeID, id.Cluster, ttl)
	if err != nil {
		return nil, s.fail(ctx, id, claimed, refuse(codes.Internal, caReasonSigning, "signing the certificate of %s failed: %v", id.SpiffeID, err))
	}
	resp := &securityv1alpha1.IstioCertificateResponse{CertChain: make([]string, len(chain))}
	for i, c := range chain[:len(chain)-1] {
		resp.CertChain[i] = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
	}
	resp.CertChain[len(chain)-1] = s.rootBundle(chain[len(chain)-1])
	s.stats.issued(id.Cluster, id.Namespace, id.SpiffeID.String(), chain[0].NotAfter, time.Since(start))
	s.log.Debug("workload certificate issued", "cluster", id.Cluster, "identity", id.SpiffeID.String(), "byToken", id.FromToken,
		"notAfter", chain[0].NotAfter.UTC().Format(time.RFC3339), "peer", peerAddr(ctx))
	return resp, nil
}

// rootBundle is the last element of a response: the root that anchors the
// chain, then every other root of our trust domain the hub still trusts
// (an earlier one, until it expires), as one PEM string, as istiod answers
// ("the root cert is the last element": it appends its root bundle
// unsplit). istio-agent serves that element whole as its workload's trust
// bundle (Envoy's ROOTCA, a proxyless workload's root-cert.pem), so a
// workload whose certificate is renewed after a root change still trusts
// the peers whose certificates chain to the earlier root.
func (s *Server) rootBundle(anchor *x509.Certificate) string {
	out := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: anchor.Raw})
	if s.roots == nil {
		return string(out)
	}
	all, ok := s.roots.RootsPEM(s.roots.LocalTrustDomain())
	if !ok {
		return string(out)
	}
	for rest := all; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type == "CERTIFICATE" && !bytes.Equal(b.Bytes, anchor.Raw) {
			out = append(out, pem.EncodeToMemory(b)...)
		}
	}
	return string(out)
}

// inScope refuses an identity its member may not assert.
func (s *Server) inScope(id authn.Identity) error {
	if err := s.scope.Allow(id.Cluster, id.Namespace); err != nil {
		s.scope.Count("ca", err)
		se := err.(*authn.ScopeError)
		return refuse(codes.PermissionDenied, se.Reason, "%s may not be issued: %s", id.SpiffeID, se.Error())
	}
	return nil
}

// acquire waits for a worker slot until ctx ends (then it returns
// ctx's error), a renewal also for a renewal slot, and returns the slot's
// release. Past maxWaiting waiting requests it refuses at once. A caller
// whose ctx has ended gets no slot: whenever it returns a release, the
// caller must call it.
func (s *Server) acquire(ctx context.Context, renewal bool) (func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select { // a free slot: no queueing
	case s.workers <- struct{}{}:
		return func() { <-s.workers }, nil
	default:
	}
	if s.waiting.Add(1) > s.maxWaiting {
		s.waiting.Add(-1)
		return nil, refuse(codes.ResourceExhausted, caReasonOverloaded,
			"the CA already has %d requests waiting for a worker: try again later", s.maxWaiting)
	}
	defer s.waiting.Add(-1)
	renewals := s.renewals
	if !renewal {
		renewals = nil // a nil channel never receives: tokens use the shared slots only
	}
	select {
	case s.workers <- struct{}{}:
		return func() { <-s.workers }, nil
	case renewals <- struct{}{}:
		return func() { <-s.renewals }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// fail counts and logs a refused request and returns its gRPC status.
func (s *Server) fail(ctx context.Context, id authn.Identity, claimed string, err error) error {
	ce, ok := err.(*caError)
	if !ok {
		ce = refuse(codes.Internal, caReasonSigning, "%v", err)
	}
	s.stats.failed(ce.reason, ce.msg)
	cluster := id.Cluster
	if cluster == "" {
		cluster = clip.String(claimed, 64)
	}
	ident := ""
	if !id.SpiffeID.IsZero() {
		ident = id.SpiffeID.String()
	}
	s.log.Warn("workload certificate refused", "cluster", cluster, "identity", ident, "reason", ce.reason,
		"code", ce.code.String(), "error", ce.msg, "peer", peerAddr(ctx))
	return status.Error(ce.code, ce.msg)
}

// authenticate returns the caller's identity and the member its ClusterID
// header names (as sent, for logs): from a verified client certificate if
// it presented one, else from its service-account token.
func (s *Server) authenticate(ctx context.Context) (authn.Identity, string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	claimed := ""
	if v := md.Get("clusterid"); len(v) > 0 {
		claimed = v[0]
	}
	pr, _ := peer.FromContext(ctx)
	var info credentials.TLSInfo
	if pr != nil {
		info, _ = pr.AuthInfo.(credentials.TLSInfo)
	}
	if !info.State.HandshakeComplete {
		return authn.Identity{}, claimed, refuse(codes.Unauthenticated, caReasonNoCredentials, "the CA is served only over TLS")
	}
	if len(info.State.PeerCertificates) > 0 {
		id, err := s.fromCertificate(info.State.PeerCertificates, claimed)
		return id, claimed, err
	}
	token := authn.BearerToken(md)
	if token == "" {
		return authn.Identity{}, claimed, refuse(codes.Unauthenticated, caReasonNoCredentials,
			"a client certificate issued by this hub or a Kubernetes service-account token (authorization: Bearer) is required")
	}
	if claimed == "" {
		return authn.Identity{}, claimed, refuse(codes.Unauthenticated, caReasonNoCredentials,
			"the ClusterID header is required with a service-account token: it names the member cluster that reviews the token")
	}
	id, err := s.tokens.Authenticate(ctx, claimed, token, caTokenMaxAge)
	switch code := authn.TokenErrorCode(err); {
	case err == nil:
	case code == codes.Unavailable:
		return authn.Identity{}, claimed, refuse(code, caReasonReviewUnavailable,
			"member %s could not review the service-account token in time; try again: %v", clip.String(claimed, 64), err)
	case code == codes.ResourceExhausted:
		return authn.Identity{}, claimed, refuse(code, caReasonRateLimited, "%v", err)
	case code == codes.PermissionDenied:
		s.scope.Count("ca", err)
		return authn.Identity{}, claimed, refuse(code, err.(*authn.ScopeError).Reason, "%v", err)
	default:
		return authn.Identity{}, claimed, refuse(codes.Unauthenticated, caReasonTokenRejected,
			"the service-account token was not accepted by member %s: %v", clip.String(claimed, 64), err)
	}
	return id, claimed, nil
}

// fromCertificate authenticates a client certificate the TLS listener has
// verified (against the bundle of the trust domain it names): only a
// workload certificate of our own trust domain bound to a member by our
// CA may renew itself. A federated peer's certificate never gets one of
// ours.
func (s *Server) fromCertificate(chain []*x509.Certificate, claimed string) (authn.Identity, error) {
	sid, err := x509svid.IDFromCert(chain[0])
	if err != nil {
		return authn.Identity{}, refuse(codes.Unauthenticated, caReasonCertificateRejected, "the client certificate has no SPIFFE ID: %v", err)
	}
	local := s.roots.LocalTrustDomain()
	if sid.TrustDomain().Name() != local {
		return authn.Identity{}, refuse(codes.Unauthenticated, caReasonCertificateRejected,
			"the client certificate is of trust domain %s: this CA issues certificates of %s to its own workloads only (use a service-account token)", sid.TrustDomain().Name(), local)
	}
	id := authn.Identity{SpiffeID: sid, Namespace: authn.NamespaceOf(sid)}
	if id.Namespace == "" || authn.ServiceAccountOf(sid) == "" {
		return id, refuse(codes.Unauthenticated, caReasonCertificateRejected, "%s is not a workload identity (spiffe://%s/ns/<namespace>/sa/<service account>)", sid, local)
	}
	if id.Cluster = authn.MemberBinding(chain, s.roots); id.Cluster == "" {
		return id, refuse(codes.Unauthenticated, caReasonCertificateRejected,
			"the client certificate of %s is not bound to a member cluster by this hub's CA (use a service-account token)", sid)
	}
	if claimed != "" && claimed != id.Cluster {
		return id, refuse(codes.Unauthenticated, caReasonClusterMismatch,
			"the client certificate of %s is bound to member %s, not to %s named by the ClusterID header", sid, id.Cluster, clip.String(claimed, 64))
	}
	id.NotAfter = chain[0].NotAfter
	return id, nil
}

// parseCSR parses a PEM CSR whose key is RSA of 2048 to 4096 bits with
// exponent 65537, or ECDSA on P-256 or P-384; its signature is not checked
// yet (the caller does, in a worker slot: it costs CPU). Nothing else of
// the CSR is used: its subject and SANs are ignored.
func parseCSR(csrPEM string) (*x509.CertificateRequest, error) {
	invalid := func(format string, args ...any) error {
		return refuse(codes.InvalidArgument, caReasonInvalidCSR, format, args...)
	}
	if csrPEM == "" {
		return nil, invalid("the request has no CSR")
	}
	if len(csrPEM) > maxCSRBytes {
		return nil, invalid("the CSR is %d bytes; at most %d are accepted", len(csrPEM), maxCSRBytes)
	}
	block, _ := pem.Decode([]byte(csrPEM))
	if block == nil || (block.Type != "CERTIFICATE REQUEST" && block.Type != "NEW CERTIFICATE REQUEST") {
		return nil, invalid("the CSR is not a PEM CERTIFICATE REQUEST")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, invalid("the CSR cannot be parsed: %v", err)
	}
	switch k := csr.PublicKey.(type) {
	case *rsa.PublicKey:
		if bits := k.N.BitLen(); bits < minRSABits || bits > maxRSABits {
			return nil, invalid("the CSR's RSA key has %d bits; %d to %d are accepted", bits, minRSABits, maxRSABits)
		}
		if k.E != rsaExponent {
			return nil, invalid("the CSR's RSA key has public exponent %d; only %d is accepted", k.E, rsaExponent)
		}
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return nil, invalid("the CSR's ECDSA key is on curve %s; P-256 and P-384 are accepted", k.Curve.Params().Name)
		}
	default:
		return nil, invalid("the CSR's %s key is not accepted: RSA (2048 bits or more) and ECDSA (P-256, P-384) are", csr.PublicKeyAlgorithm)
	}
	return csr, nil
}

// ttl is the lifetime of the certificate asked for: validity_duration
// seconds, the default when it is not positive.
func (s *Server) ttl(seconds int64) (time.Duration, error) {
	if seconds <= 0 {
		return s.defaultTTL, nil
	}
	if seconds > int64(s.maxTTL/time.Second) {
		return 0, refuse(codes.InvalidArgument, caReasonInvalidTTL,
			"validity_duration %ds is above the maximum workload certificate lifetime %s (--max-workload-cert-ttl)", seconds, s.maxTTL)
	}
	return time.Duration(seconds) * time.Second, nil
}

func peerAddr(ctx context.Context) string {
	if pr, ok := peer.FromContext(ctx); ok && pr.Addr != nil {
		return pr.Addr.String()
	}
	return ""
}
