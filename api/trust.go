package api

import (
	"context"
	"errors"
	"net/http"
	"sort"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/hubmesh/hub/trust"
)

// Trust is the read and write model of SPIFFE federation.
type Trust interface {
	TrustDomains() []trust.Status
	TrustDomain(td string) (trust.Status, error)
	ApplyPeer(ctx context.Context, spec trust.PeerSpec) (created bool, err error)
	DeletePeer(ctx context.Context, td string) error
	Refresh(td string) bool
	GetBundleForTrustDomain(td spiffeid.TrustDomain) (*spiffebundle.Bundle, error)
}

// X509Authority is one root of a bundle.
type X509Authority struct {
	Subject  string    `json:"subject"`
	NotAfter time.Time `json:"notAfter"`
	SHA256   string    `json:"sha256"`
}

// JWTAuthority is one JWT signing key of a bundle.
type JWTAuthority struct {
	KeyID string `json:"keyID"`
}

// TrustDomain is the JSON form of a trust domain (docs/architecture.md §3.3, §3.5).
type TrustDomain struct {
	TrustDomain       string          `json:"trustDomain"`
	Local             bool            `json:"local"`
	BundleEndpointURL string          `json:"bundleEndpointURL"`
	Profile           string          `json:"profile"`
	EndpointSPIFFEID  string          `json:"endpointSPIFFEID"`
	State             string          `json:"state"`
	Message           string          `json:"message"`
	LastRefresh       *time.Time      `json:"lastRefresh"`
	NextRefresh       *time.Time      `json:"nextRefresh"`
	Sequence          *uint64         `json:"sequence"`
	RefreshHint       *int64          `json:"refreshHint"`
	X509Authorities   []X509Authority `json:"x509Authorities"`
	JWTAuthorities    []JWTAuthority  `json:"jwtAuthorities"`
	// BundleExpiry is, for a peer, the first X.509 authority of its bundle
	// to expire (absent while there is none).
	BundleExpiry *CertExpiry `json:"bundleExpiry,omitempty"`
	// CA is, for our own trust domain, when our CA's root and chain expire.
	CA *CAExpiry `json:"ca,omitempty"`
}

// ToTrustDomain converts a trust domain status.
func ToTrustDomain(st trust.Status) TrustDomain {
	out := TrustDomain{
		TrustDomain: st.Spec.TrustDomain, Local: st.Local, BundleEndpointURL: st.Spec.BundleEndpointURL,
		Profile: string(st.Spec.Profile), EndpointSPIFFEID: st.Spec.EndpointSPIFFEID,
		State: string(st.State), Message: st.Message, LastRefresh: timePtr(st.LastSuccess), NextRefresh: timePtr(st.NextRefresh),
		X509Authorities: []X509Authority{}, JWTAuthorities: []JWTAuthority{},
		BundleExpiry: ToCertExpiry(st.BundleExpiry), CA: ToCAExpiry(st.CA),
	}
	if b := st.Bundle; b != nil {
		if s, ok := b.SequenceNumber(); ok {
			out.Sequence = &s
		}
		if h, ok := b.RefreshHint(); ok {
			secs := int64(h / time.Second)
			out.RefreshHint = &secs
		}
		for _, c := range b.X509Authorities() {
			out.X509Authorities = append(out.X509Authorities, X509Authority{Subject: c.Subject.String(), NotAfter: c.NotAfter.UTC(), SHA256: trust.CertSHA256(c)})
		}
		for id := range b.JWTAuthorities() {
			out.JWTAuthorities = append(out.JWTAuthorities, JWTAuthority{KeyID: id})
		}
		sort.Slice(out.JWTAuthorities, func(i, j int) bool { return out.JWTAuthorities[i].KeyID < out.JWTAuthorities[j].KeyID })
	}
	return out
}

// PeerRequest is the body of PUT /api/v1/trustdomains/{td}.
type PeerRequest struct {
	BundleEndpointURL string `json:"bundleEndpointURL"`
	Profile           string `json:"profile"`
	EndpointSPIFFEID  string `json:"endpointSPIFFEID,omitempty"`
	Bundle            string `json:"bundle,omitempty"`
	CABundle          string `json:"caBundle,omitempty"`
}

func (s *server) trustOrProblem(w http.ResponseWriter) Trust {
	if s.cfg.Trust == nil {
		WriteProblem(w, http.StatusNotFound, "trust federation is not configured on this hub")
	}
	return s.cfg.Trust
}

func (s *server) listTrustDomains(w http.ResponseWriter, _ *http.Request) {
	t := s.trustOrProblem(w)
	if t == nil {
		return
	}
	out := List[TrustDomain]{Items: []TrustDomain{}}
	for _, st := range t.TrustDomains() {
		out.Items = append(out.Items, ToTrustDomain(st))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) getTrustDomain(w http.ResponseWriter, r *http.Request) {
	t := s.trustOrProblem(w)
	if t == nil {
		return
	}
	st, err := t.TrustDomain(chi.URLParam(r, "td"))
	if err != nil {
		WriteProblem(w, http.StatusNotFound, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, ToTrustDomain(st))
}

func (s *server) trustDomainBundle(w http.ResponseWriter, r *http.Request) {
	t := s.trustOrProblem(w)
	if t == nil {
		return
	}
	td, err := spiffeid.TrustDomainFromString(chi.URLParam(r, "td"))
	if err != nil {
		WriteProblem(w, http.StatusNotFound, "trust domain: "+err.Error())
		return
	}
	b, err := t.GetBundleForTrustDomain(td)
	if err != nil {
		WriteProblem(w, http.StatusNotFound, err.Error())
		return
	}
	data, err := b.Marshal()
	if err != nil {
		WriteProblem(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(data)
}

func (s *server) putTrustDomain(w http.ResponseWriter, r *http.Request) {
	t := s.trustOrProblem(w)
	if t == nil {
		return
	}
	var req PeerRequest
	if status, err := decodeStrict(w, r, &req); err != nil {
		WriteProblem(w, status, err.Error())
		return
	}
	spec := trust.PeerSpec{
		TrustDomain: chi.URLParam(r, "td"), BundleEndpointURL: req.BundleEndpointURL, Profile: trust.Profile(req.Profile),
		EndpointSPIFFEID: req.EndpointSPIFFEID, Bundle: req.Bundle, CABundle: req.CABundle,
	}
	created, err := t.ApplyPeer(r.Context(), spec)
	if err != nil {
		s.writeTrustError(w, err)
		return
	}
	st, err := t.TrustDomain(spec.TrustDomain)
	if err != nil || st.Spec != spec {
		st = trust.Status{Spec: spec, State: trust.StatePending, Message: "configured; waiting for the first fetch"}
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, ToTrustDomain(st))
}

func (s *server) deleteTrustDomain(w http.ResponseWriter, r *http.Request) {
	t := s.trustOrProblem(w)
	if t == nil {
		return
	}
	if err := t.DeletePeer(r.Context(), chi.URLParam(r, "td")); err != nil {
		s.writeTrustError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) refreshTrustDomain(w http.ResponseWriter, r *http.Request) {
	t := s.trustOrProblem(w)
	if t == nil {
		return
	}
	td := chi.URLParam(r, "td")
	if !t.Refresh(td) {
		WriteProblem(w, http.StatusNotFound, "no federation relationship with "+td)
		return
	}
	st, _ := t.TrustDomain(td)
	writeJSON(w, http.StatusOK, ToTrustDomain(st))
}

func (s *server) writeTrustError(w http.ResponseWriter, err error) {
	var inv *trust.InvalidError
	if errors.As(err, &inv) {
		WriteProblem(w, http.StatusUnprocessableEntity, inv.Error())
		return
	}
	s.cfg.Log.Error("API request failed", "error", err)
	WriteProblem(w, http.StatusBadGateway, "the home cluster rejected the change: "+err.Error())
}
