package web

import (
	"fmt"
	"sync"
	"time"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/hub/xdsstatus"
	"github.com/hubmesh/hub/trust"
)

// pictureModels is a settable federation for the picture's tests: members,
// connected xDS clients and trust domains.
type pictureModels struct {
	fakeModels
	mu      sync.Mutex
	members []clusters.Status
	proxies []xdsstatus.Proxy
	tds     []trust.Status
}

func (m *pictureModels) Clusters() []clusters.Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]clusters.Status(nil), m.members...)
}

func (m *pictureModels) Proxies() []xdsstatus.Proxy {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]xdsstatus.Proxy(nil), m.proxies...)
}

func (m *pictureModels) TrustDomains() []trust.Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]trust.Status(nil), m.tds...)
}

// setState changes one member's state.
func (m *pictureModels) setState(id string, s clusters.State) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.members {
		if m.members[i].ID == id {
			m.members[i].State = s
		}
	}
}

func (m *pictureModels) config() Config {
	return Config{Membership: m, Registrar: m, Serving: m, Trust: m, CA: m, Auth: &fakeAuth{}, Refresh: 20 * time.Millisecond}
}

// certified is what the overview takes from the CA (fakeModels'
// Certificates: 7 identities in west).
func (m *pictureModels) certified() map[string]int {
	out := map[string]int{}
	st, _ := m.Certificates()
	for _, g := range st.Groups {
		out[g.Member] += g.Valid
	}
	return out
}

// federation builds a federation of the home cluster "primary" and n
// members: each member has proxyless gRPC clients, every third an Envoy,
// every fourth an istiod; one istiod and one client of an unknown member
// are not tied to any; two trust domains.
func federation(n int) *pictureModels {
	m := &pictureModels{}
	m.members = append(m.members, clusters.Status{ID: "primary", State: clusters.StateReady, Services: 4, Endpoints: 9})
	names := []string{"west", "east", "north"}
	for i := range n {
		id := fmt.Sprintf("member-%02d", i)
		if i < len(names) {
			id = names[i]
		}
		st := clusters.Status{ID: id, Secret: "istio-system/istio-remote-secret-" + id, State: clusters.StateReady,
			Services: 3 + i%4, Endpoints: 6 + i*2}
		switch {
		case n > 3 && i%11 == 5:
			st.State = clusters.StateStale
		case n > 3 && i%17 == 7:
			st.State = clusters.StateUnreachable
		case n > 3 && i%13 == 9:
			st.State = clusters.StateSyncing
		}
		m.members = append(m.members, st)
		for j := range 1 + i%3 {
			m.proxies = append(m.proxies, xdsstatus.Proxy{ID: fmt.Sprintf("client-%d~%s", j, id), Cluster: id, Proxyless: true})
		}
		if i%3 == 0 {
			m.proxies = append(m.proxies, xdsstatus.Proxy{ID: "sidecar~10.0.0.1~envoy." + id, Cluster: id})
		}
		if i%4 == 1 {
			m.proxies = append(m.proxies, xdsstatus.Proxy{ID: "istiod-" + id, Cluster: id, ConfigSubscriber: true, IstioVersion: "1.31.1"})
		}
	}
	m.proxies = append(m.proxies,
		xdsstatus.Proxy{ID: "istiod-unclaimed", ConfigSubscriber: true},
		xdsstatus.Proxy{ID: "client~of-nobody", Cluster: "not-registered", Proxyless: true})
	m.tds = []trust.Status{
		{Spec: trust.PeerSpec{TrustDomain: "cluster.local"}, Local: true, State: trust.StateReady},
		{Spec: trust.PeerSpec{TrustDomain: "partner.example.org"}, State: trust.StateReady},
	}
	if n > 3 {
		m.tds = append(m.tds, trust.Status{Spec: trust.PeerSpec{TrustDomain: "late.example.net"}, State: trust.StatePending})
	}
	return m
}

// setNetworks puts the federation on Istio networks: the home cluster on
// net-central with a gateway, the members on net-west, net-east and
// net-central in turn with a gateway each, except every fifth from the
// third (north), which has none (its endpoints are withheld from other
// networks), and every ninth from the fifth, which is on no network;
// net-east's gateways do not admit proxyless gRPC.
func (m *pictureModels) setNetworks() {
	m.mu.Lock()
	defer m.mu.Unlock()
	names := []string{"net-west", "net-east", "net-central"}
	gw := []clusters.Gateway{{Address: "192.0.2.10", Port: clusters.DefaultGatewayPort, Source: "service istio-system/istio-eastwestgateway"}}
	for i := range m.members {
		st := &m.members[i]
		st.Network, st.Gateways, st.CrossNetworkWithheld, st.ProxylessWithheld = "net-central", gw, 0, 0
		if i == 0 {
			continue
		}
		switch j := i - 1; {
		case j%9 == 4:
			st.Network, st.Gateways = "", nil
		case j%5 == 2: // a network on which no member has a gateway
			st.Network, st.Gateways, st.CrossNetworkWithheld, st.ProxylessWithheld = "net-dark", nil, st.Endpoints, st.Endpoints
		default:
			st.Network = names[j%3]
			if st.Network == "net-east" {
				st.ProxylessWithheld = st.Endpoints
			}
		}
	}
}

// demote marks one member demoted, or no longer demoted with reason "".
func (m *pictureModels) demote(id, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.members {
		if m.members[i].ID == id {
			m.members[i].Demoted = reason
		}
	}
}
