package hub

import (
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

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
)

// Istio's CA API (DESIGN.md §3.8): istio-agent sends a CSR to
// istio.v1.auth.IstioCertificateService/CreateCertificate on the mTLS xDS
// port and gets the certificate of its workload identity. The caller
// proves who it is with a client certificate of our trust domain bound to
// a member (renewal), else with a Kubernetes service-account token that
// the member named by its ClusterID header reviews. The certificate names
// exactly that identity, whatever the CSR asks for, and is bound to that
// member (trust.MemberOID), which SDS relies on.

// WorkloadSigner signs workload certificates for Istio's CA API
// (trust.Federation implements it).
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

// caServer is the IstioCertificateService of the mTLS listener.
type caServer struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer
	signer     WorkloadSigner
	roots      RootSource
	tokens     *tokenAuth // nil: tokens are not accepted
	defaultTTL time.Duration
	maxTTL     time.Duration
	members    Members // nil: every member a credential proves is taken as current
	stats      *caStats
	log        *slog.Logger
	scope      *identityScope // nil: any identity a credential proves
	workers    chan struct{}  // a slot per request being checked and signed (caWorkers)
	renewals   chan struct{}  // more slots for renewals by certificate (caRenewalWorkers)
	waiting    atomic.Int64   // requests waiting for a slot
	maxWaiting int64
}

func newCAServer(signer WorkloadSigner, roots RootSource, tokens *tokenAuth, maxTTL time.Duration, log *slog.Logger) *caServer {
	if maxTTL <= 0 {
		maxTTL = DefaultMaxWorkloadCertTTL
	}
	return &caServer{signer: signer, roots: roots, tokens: tokens,
		defaultTTL: min(DefaultWorkloadCertTTL, maxTTL), maxTTL: maxTTL, stats: newCAStats(), log: log,
		workers: make(chan struct{}, caWorkers), renewals: make(chan struct{}, caRenewalWorkers),
		maxWaiting: int64(caQueuePerSlot * (caWorkers + caRenewalWorkers))}
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
	// PermissionDenied: an identity its member may not assert (scope*).
	caReasonMemberNotSynced     = scopeMemberNotSynced
	caReasonHubNamespace        = scopeHubNamespace
	caReasonRootNamespace       = scopeRootNamespace
	caReasonNamespaceNotAllowed = scopeNamespaceNotAllowed
	caReasonInvalidCSR          = "invalid_csr"
	caReasonInvalidTTL          = "invalid_ttl"
	caReasonSigning             = "signing_failed" // Internal
)

// caReasons lists every reason, for the read model's stable order.
var caReasons = []string{caReasonNoCredentials, caReasonTokenRejected, caReasonReviewUnavailable, caReasonCertificateRejected,
	caReasonClusterMismatch, caReasonNotMember, caReasonRateLimited, caReasonOverloaded, caReasonMemberNotSynced,
	caReasonHubNamespace, caReasonRootNamespace, caReasonNamespaceNotAllowed, caReasonInvalidCSR, caReasonInvalidTTL, caReasonSigning}

// CreateCertificate signs the CSR's public key for the caller's
// authenticated identity if its member may assert it (identityScope).
// Errors are Unauthenticated (who the caller is), PermissionDenied (an
// identity its member may not assert), ResourceExhausted (rate limited or
// overloaded), Unavailable (the member did not answer), InvalidArgument
// (what it asked for) or Internal (signing); each is logged with the
// member, the identity when known and the reason, never with the token or
// the CSR.
func (s *caServer) CreateCertificate(ctx context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	start := time.Now()
	id, claimed, err := s.authenticate(ctx)
	if err == nil && s.members != nil && !s.members.IsCluster(id.cluster) {
		// A renewal, or a token reviewed before the member was removed.
		err = refuse(codes.Unauthenticated, caReasonNotMember,
			"member %s, which the credential of %s proves, is not in the federation (removed or invalid)", id.cluster, id.spiffeID)
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
	release, err := s.acquire(ctx, !id.notAfter.IsZero())
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
	if !id.notAfter.IsZero() {
		// A renewal by certificate: never beyond it (X.509 keeps whole
		// seconds, truncated, so the new one ends at the same second).
		if ttl = min(ttl, time.Until(id.notAfter)); ttl <= 0 {
			return nil, s.fail(ctx, id, claimed, refuse(codes.Unauthenticated, caReasonCertificateRejected,
				"the client certificate of %s has expired", id.spiffeID))
		}
	}
	chain, err := s.signer.SignWorkload(pub, id.spiffeID, id.cluster, ttl)
	if err != nil {
		return nil, s.fail(ctx, id, claimed, refuse(codes.Internal, caReasonSigning, "signing the certificate of %s failed: %v", id.spiffeID, err))
	}
	resp := &securityv1alpha1.IstioCertificateResponse{CertChain: make([]string, len(chain))}
	for i, c := range chain {
		resp.CertChain[i] = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
	}
	s.stats.issued(id.cluster, id.namespace, id.spiffeID.String(), chain[0].NotAfter, time.Since(start))
	s.log.Debug("workload certificate issued", "cluster", id.cluster, "identity", id.spiffeID.String(), "byToken", id.fromToken,
		"notAfter", chain[0].NotAfter.UTC().Format(time.RFC3339), "peer", peerAddr(ctx))
	return resp, nil
}

// inScope refuses an identity its member may not assert.
func (s *caServer) inScope(id identity) error {
	if err := s.scope.allow(id.cluster, id.namespace); err != nil {
		s.scope.count("ca", err)
		se := err.(*scopeError)
		return refuse(codes.PermissionDenied, se.reason, "%s may not be issued: %s", id.spiffeID, se.msg)
	}
	return nil
}

// acquire waits for a worker slot until ctx ends (then it returns
// ctx's error), a renewal also for a renewal slot, and returns the slot's
// release. Past maxWaiting waiting requests it refuses at once. A caller
// whose ctx has ended gets no slot: whenever it returns a release, the
// caller must call it.
func (s *caServer) acquire(ctx context.Context, renewal bool) (func(), error) {
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
func (s *caServer) fail(ctx context.Context, id identity, claimed string, err error) error {
	ce, ok := err.(*caError)
	if !ok {
		ce = refuse(codes.Internal, caReasonSigning, "%v", err)
	}
	s.stats.failed(ce.reason, ce.msg)
	cluster := id.cluster
	if cluster == "" {
		cluster = truncate(claimed, 64)
	}
	ident := ""
	if !id.spiffeID.IsZero() {
		ident = id.spiffeID.String()
	}
	s.log.Warn("workload certificate refused", "cluster", cluster, "identity", ident, "reason", ce.reason,
		"code", ce.code.String(), "error", ce.msg, "peer", peerAddr(ctx))
	return status.Error(ce.code, ce.msg)
}

// authenticate returns the caller's identity and the member its ClusterID
// header names (as sent, for logs): from a verified client certificate if
// it presented one, else from its service-account token.
func (s *caServer) authenticate(ctx context.Context) (identity, string, error) {
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
		return identity{}, claimed, refuse(codes.Unauthenticated, caReasonNoCredentials, "the CA is served only over TLS")
	}
	if len(info.State.PeerCertificates) > 0 {
		id, err := s.fromCertificate(info.State.PeerCertificates, claimed)
		return id, claimed, err
	}
	token := bearerToken(md)
	if token == "" {
		return identity{}, claimed, refuse(codes.Unauthenticated, caReasonNoCredentials,
			"a client certificate issued by this hub or a Kubernetes service-account token (authorization: Bearer) is required")
	}
	if claimed == "" {
		return identity{}, claimed, refuse(codes.Unauthenticated, caReasonNoCredentials,
			"the ClusterID header is required with a service-account token: it names the member cluster that reviews the token")
	}
	id, err := s.tokens.authenticate(ctx, claimed, token, caTokenMaxAge)
	switch code := tokenErrorCode(err); {
	case err == nil:
	case code == codes.Unavailable:
		return identity{}, claimed, refuse(code, caReasonReviewUnavailable,
			"member %s could not review the service-account token in time; try again: %v", truncate(claimed, 64), err)
	case code == codes.ResourceExhausted:
		return identity{}, claimed, refuse(code, caReasonRateLimited, "%v", err)
	case code == codes.PermissionDenied:
		s.scope.count("ca", err)
		return identity{}, claimed, refuse(code, err.(*scopeError).reason, "%v", err)
	default:
		return identity{}, claimed, refuse(codes.Unauthenticated, caReasonTokenRejected,
			"the service-account token was not accepted by member %s: %v", truncate(claimed, 64), err)
	}
	return id, claimed, nil
}

// fromCertificate authenticates a client certificate the TLS listener has
// verified (against the bundle of the trust domain it names): only a
// workload certificate of our own trust domain bound to a member by our
// CA may renew itself. A federated peer's certificate never gets one of
// ours.
func (s *caServer) fromCertificate(chain []*x509.Certificate, claimed string) (identity, error) {
	sid, err := x509svid.IDFromCert(chain[0])
	if err != nil {
		return identity{}, refuse(codes.Unauthenticated, caReasonCertificateRejected, "the client certificate has no SPIFFE ID: %v", err)
	}
	local := s.roots.LocalTrustDomain()
	if sid.TrustDomain().Name() != local {
		return identity{}, refuse(codes.Unauthenticated, caReasonCertificateRejected,
			"the client certificate is of trust domain %s: this CA issues certificates of %s to its own workloads only (use a service-account token)", sid.TrustDomain().Name(), local)
	}
	id := identity{spiffeID: sid, namespace: namespaceOf(sid)}
	if id.namespace == "" || serviceAccountOf(sid) == "" {
		return id, refuse(codes.Unauthenticated, caReasonCertificateRejected, "%s is not a workload identity (spiffe://%s/ns/<namespace>/sa/<service account>)", sid, local)
	}
	if id.cluster = memberBinding(chain, s.roots); id.cluster == "" {
		return id, refuse(codes.Unauthenticated, caReasonCertificateRejected,
			"the client certificate of %s is not bound to a member cluster by this hub's CA (use a service-account token)", sid)
	}
	if claimed != "" && claimed != id.cluster {
		return id, refuse(codes.Unauthenticated, caReasonClusterMismatch,
			"the client certificate of %s is bound to member %s, not to %s named by the ClusterID header", sid, id.cluster, truncate(claimed, 64))
	}
	id.notAfter = chain[0].NotAfter
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
func (s *caServer) ttl(seconds int64) (time.Duration, error) {
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
