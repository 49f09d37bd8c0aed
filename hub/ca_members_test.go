package hub

import (
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// memberSet is the federation's membership as the registry reports it.
type memberSet struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (m *memberSet) IsCluster(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ids[id]
}

// A member removed from the federation (its key deleted from the remote
// secret, or turned invalid) gets no more certificates: neither by
// renewing one bound to it, which otherwise would keep its workloads'
// identities alive for ever, nor by a token the hub accepted a moment
// before (its review is remembered for a minute).
func TestCANoCertificatesForARemovedMember(t *testing.T) {
	members := &memberSet{ids: map[string]bool{"west": true, "east": true}}
	signer := &caSigner{}
	s := startSecureHub(t, Options{Tokens: caTokens, Signer: signer, Members: members})
	signer.ca = s.ca
	csr := newCSR(t, rsaKey())
	resp, err := s.createCertificate(t, s.secure, caCall{creds: s.anonymous(), token: "west-token-a-gw", cluster: "west", csr: csr})
	if err != nil {
		t.Fatal(err)
	}
	ours := s.withIssued(t, resp)
	if _, err := s.createCertificate(t, s.secure, caCall{creds: ours, cluster: "west", csr: csr}); err != nil {
		t.Fatalf("renewal while west is a member: %v", err)
	}

	members.mu.Lock()
	delete(members.ids, "west")
	members.mu.Unlock()
	for name, call := range map[string]caCall{
		"renewal":               {creds: ours, cluster: "west", csr: csr},
		"renewal, no ClusterID": {creds: ours, csr: csr},
		"cached token":          {creds: s.anonymous(), token: "west-token-a-gw", cluster: "west", csr: csr},
	} {
		if _, err := s.createCertificate(t, s.secure, call); status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s after west was removed: %v; want Unauthenticated", name, err)
		}
	}
	if _, err := s.createCertificate(t, s.secure, caCall{creds: s.anonymous(), token: "east-token-b-api", cluster: "east", csr: csr}); err != nil {
		t.Errorf("east after west was removed: %v", err)
	}
}
