package hub

import (
	"context"
	"sort"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/anypb"
)

// TypeStatus is the protocol state of one resource type on one stream.
type TypeStatus struct {
	TypeURL       string
	SentVersion   string
	SentNonce     string
	SentAt        time.Time
	Resources     int
	Sends         int
	AckedVersion  string
	AckedAt       time.Time
	NackedVersion string
	NackError     string
	NackedAt      time.Time
	Nacks         int
}

// ProxyStatus is what the hub knows about one connected xDS stream.
type ProxyStatus struct {
	ID          string // node.id
	Stream      int64
	Cluster     string // member cluster from node metadata CLUSTER_ID
	Namespace   string // node metadata NAMESPACE
	Address     string // peer address
	ConnectedAt time.Time
	Types       []TypeStatus // by type URL
}

// ProxyConfig is the last response a stream received for each type.
type ProxyConfig struct {
	Proxy     ProxyStatus
	Resources map[string][]*anypb.Any // by type URL; shared, do not modify
}

// proxyTracker follows every ADS stream through go-control-plane's server
// callbacks: who is connected, what was sent, what was ACKed or NACKed.
type proxyTracker struct {
	mu      sync.Mutex
	streams map[int64]*streamState
	pushes  [60]uint32 // responses per second, ring indexed by unix second
	pushAt  [60]int64

	connected prometheus.Gauge
	responses *prometheus.CounterVec
	nacks     *prometheus.CounterVec
}

type streamState struct {
	status ProxyStatus
	types  map[string]*TypeStatus
	nonces map[string]string       // nonce → version, per stream (nonces are unique per stream)
	last   map[string][]*anypb.Any // type URL → resources of the last response
}

func newProxyTracker() *proxyTracker {
	return &proxyTracker{
		streams: map[int64]*streamState{},
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hub_xds_connected_streams", Help: "Open ADS streams.",
		}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hub_xds_responses_total", Help: "xDS responses sent, by type.",
		}, []string{"type"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hub_xds_nacks_total", Help: "xDS responses rejected by clients, by type.",
		}, []string{"type"}),
	}
}

func (p *proxyTracker) collectors() []prometheus.Collector {
	return []prometheus.Collector{p.connected, p.responses, p.nacks}
}

// shortType is the last path element of a type URL, e.g. "Cluster".
func shortType(typeURL string) string {
	return typeURL[strings.LastIndexByte(typeURL, '.')+1:]
}

func (p *proxyTracker) onStreamOpen(ctx context.Context, id int64, _ string) error {
	st := &streamState{
		status: ProxyStatus{Stream: id, ConnectedAt: time.Now()},
		types:  map[string]*TypeStatus{}, nonces: map[string]string{}, last: map[string][]*anypb.Any{},
	}
	if pr, ok := peer.FromContext(ctx); ok {
		st.status.Address = pr.Addr.String()
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("clusterid"); len(v) > 0 {
			st.status.Cluster = v[0] // DESIGN.md §3.4: the ClusterID header, unless metadata says otherwise
		}
	}
	p.mu.Lock()
	p.streams[id] = st
	p.mu.Unlock()
	p.connected.Inc()
	return nil
}

func (p *proxyTracker) onStreamClosed(id int64, _ *corev3.Node) {
	p.mu.Lock()
	delete(p.streams, id)
	p.mu.Unlock()
	p.connected.Dec()
}

func (p *proxyTracker) onStreamRequest(id int64, req *discoveryv3.DiscoveryRequest) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.streams[id]
	if st == nil {
		return nil
	}
	if n := req.GetNode(); n != nil && st.status.ID == "" {
		st.status.ID = n.GetId()
		if c := n.GetMetadata().GetFields()["CLUSTER_ID"].GetStringValue(); c != "" {
			st.status.Cluster = c
		}
		st.status.Namespace = n.GetMetadata().GetFields()["NAMESPACE"].GetStringValue()
	}
	nonce := req.GetResponseNonce()
	if nonce == "" {
		return nil
	}
	version, ok := st.nonces[nonce]
	if !ok {
		return nil
	}
	delete(st.nonces, nonce)
	ts := st.typeStatus(req.GetTypeUrl())
	if req.GetErrorDetail() != nil {
		ts.NackedVersion, ts.NackError, ts.NackedAt = version, req.GetErrorDetail().GetMessage(), time.Now()
		ts.Nacks++
		p.nacks.WithLabelValues(shortType(req.GetTypeUrl())).Inc()
	} else {
		ts.AckedVersion, ts.AckedAt = req.GetVersionInfo(), time.Now()
	}
	return nil
}

func (p *proxyTracker) onStreamResponse(_ context.Context, id int64, req *discoveryv3.DiscoveryRequest, resp *discoveryv3.DiscoveryResponse) {
	now := time.Now()
	p.responses.WithLabelValues(shortType(resp.GetTypeUrl())).Inc()
	p.mu.Lock()
	defer p.mu.Unlock()
	sec := now.Unix()
	if i := sec % 60; p.pushAt[i] != sec {
		p.pushAt[i], p.pushes[i] = sec, 0
	}
	p.pushes[sec%60]++
	st := p.streams[id]
	if st == nil {
		return
	}
	ts := st.typeStatus(resp.GetTypeUrl())
	ts.SentVersion, ts.SentNonce, ts.SentAt, ts.Resources = resp.GetVersionInfo(), resp.GetNonce(), now, len(resp.GetResources())
	ts.Sends++
	st.nonces[resp.GetNonce()] = resp.GetVersionInfo()
	if len(st.nonces) > 64 { // a client that never answers must not grow this forever
		clear(st.nonces)
		st.nonces[resp.GetNonce()] = resp.GetVersionInfo()
	}
	st.last[resp.GetTypeUrl()] = resp.GetResources()
}

func (s *streamState) typeStatus(typeURL string) *TypeStatus {
	ts := s.types[typeURL]
	if ts == nil {
		ts = &TypeStatus{TypeURL: typeURL}
		s.types[typeURL] = ts
	}
	return ts
}

func (s *streamState) snapshot() ProxyStatus {
	out := s.status
	out.Types = make([]TypeStatus, 0, len(s.types))
	for _, ts := range s.types {
		out.Types = append(out.Types, *ts)
	}
	sort.Slice(out.Types, func(i, j int) bool { return typeOrder(out.Types[i].TypeURL) < typeOrder(out.Types[j].TypeURL) })
	return out
}

func typeOrder(typeURL string) string {
	for i, t := range []string{resourcev3.ListenerType, resourcev3.RouteType, resourcev3.ClusterType, resourcev3.EndpointType, resourcev3.SecretType} {
		if t == typeURL {
			return string(rune('0' + i))
		}
	}
	return typeURL
}

// proxies lists every open stream, by proxy ID then stream.
func (p *proxyTracker) proxies() []ProxyStatus {
	p.mu.Lock()
	out := make([]ProxyStatus, 0, len(p.streams))
	for _, st := range p.streams {
		out = append(out, st.snapshot())
	}
	p.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].ID != out[j].ID {
			return out[i].ID < out[j].ID
		}
		return out[i].Stream < out[j].Stream
	})
	return out
}

// config returns the newest stream of a proxy and what it last received.
func (p *proxyTracker) config(id string) (ProxyConfig, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var found *streamState
	for _, st := range p.streams {
		if st.status.ID == id && (found == nil || st.status.Stream > found.status.Stream) {
			found = st
		}
	}
	if found == nil {
		return ProxyConfig{}, false
	}
	res := make(map[string][]*anypb.Any, len(found.last))
	for k, v := range found.last {
		res[k] = v
	}
	return ProxyConfig{Proxy: found.snapshot(), Resources: res}, true
}

// pushesPerSecond returns the responses sent in each of the last 60
// seconds, oldest first.
func (p *proxyTracker) pushesPerSecond() []int {
	now := time.Now().Unix()
	out := make([]int, 60)
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range out {
		sec := now - 59 + int64(i)
		if p.pushAt[sec%60] == sec {
			out[i] = int(p.pushes[sec%60])
		}
	}
	return out
}
