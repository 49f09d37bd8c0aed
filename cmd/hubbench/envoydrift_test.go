package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/hubmesh/hub/internal/envoy"
)

// The envoy shape is checked against a recording of a real Envoy's
// request stream (testdata/envoy-<version>-{sotw,delta}.txt): the same
// script served to the real Envoy and to one simulated stream must draw
// the same requests, in the same order, with the node on the same ones.
// Regenerate the recordings with a real Envoy:
//
//	HUB_ENVOY_BIN=$(internal/tools/envoy/install.sh) go test ./cmd/hubbench -run TestEnvoyShapeMatchesRealEnvoy -record-envoy
var recordEnvoy = flag.Bool("record-envoy", false, "rewrite testdata/envoy-*.txt from the real Envoy's request stream")

// The script (scriptADS): CDS answers with clusters a and b; EDS answers
// every name asked for. Once CDS and EDS are ACKed, CDS changes a (its
// connect timeout: a Cluster change whose assignment did not change) and
// adds c, and the server resends a's assignment with the next EDS response,
// as the hub does (the Envoy would otherwise keep a warming). The script
// ends when EDS is ACKed holding a, b and c.
const (
	scriptA = "outbound|80||drift-a.bench.svc.cluster.local"
	scriptB = "outbound|80||drift-b.bench.svc.cluster.local"
	scriptC = "outbound|80||drift-c.bench.svc.cluster.local"
)

// request is one recorded request in the protocol's own terms.
type request struct {
	typ   string   // CDS, EDS, ...
	kind  string   // "request" (no nonce), "ACK", "NACK"
	names []string // SotW: resource_names ("*" for none); Delta: "+sub" and "-unsub"
	node  bool
	bytes int // the whole request
	nodeB int // its node

	nodeMsg *corev3.Node // not recorded
}

// line is the request as a recording holds it; what follows " # " is
// informative and not compared.
func (r request) line() string {
	node := "no node"
	if r.node {
		node = "node"
	}
	return fmt.Sprintf("%s %s %s %s # %d bytes, node %d bytes", r.typ, r.kind, strings.Join(r.names, ","), node, r.bytes, r.nodeB)
}

// compared is the part of a recording line the drift test compares.
func compared(line string) string {
	before, _, _ := strings.Cut(line, " # ")
	return before
}

var shortType = map[string]string{
	resourcev3.ClusterType: "CDS", resourcev3.EndpointType: "EDS", resourcev3.ListenerType: "LDS",
	resourcev3.RouteType: "RDS", resourcev3.SecretType: "SDS",
}

func short(typeURL string) string {
	if s, ok := shortType[typeURL]; ok {
		return s
	}
	return typeURL
}

// scriptADS serves the script to one stream at a time and records what it
// is asked.
type scriptADS struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer

	mu   sync.Mutex
	reqs []request
	node *corev3.Node  // of the first request that carried one
	done chan struct{} // closed at the EDS ACK that ends the script
	once sync.Once
}

func newScriptADS() *scriptADS { return &scriptADS{done: make(chan struct{})} }

func (s *scriptADS) record(r request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, r)
	if s.node == nil && r.nodeMsg != nil {
		s.node = r.nodeMsg
	}
}

func (s *scriptADS) lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, len(s.reqs))
	for i, r := range s.reqs {
		out[i] = r.line()
	}
	return out
}

// scriptState is the script's progress on one stream.
type scriptState struct {
	step    int  // 0: a and b; 1: a changed, c added
	resendA bool // step 1: a's assignment is still to be resent
	nonce   int
	sent    map[string]sent // type → the last response
	acked   map[string]sent // type → the last response ACKed
	held    map[string]bool // EDS names in ACKed responses
}

// sent is one response: its nonce, the script step and the names it held.
type sent struct {
	nonce string
	step  int
	names []string
}

func newScriptState() *scriptState {
	return &scriptState{sent: map[string]sent{}, acked: map[string]sent{}, held: map[string]bool{}}
}

func scriptClusters(step int) []*clusterv3.Cluster {
	mk := func(name string, timeout time.Duration) *clusterv3.Cluster {
		return &clusterv3.Cluster{
			Name:                 name,
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
			ConnectTimeout:       durationpb.New(timeout),
			EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads, ServiceName: name},
		}
	}
	if step == 0 {
		return []*clusterv3.Cluster{mk(scriptA, time.Second), mk(scriptB, time.Second)}
	}
	return []*clusterv3.Cluster{mk(scriptA, 2*time.Second), mk(scriptB, time.Second), mk(scriptC, time.Second)}
}

func scriptAssignment(name string) *endpointv3.ClusterLoadAssignment {
	return &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
		LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: envoy.SocketAddress("127.0.0.1", 9),
		}}}},
	}}}
}

// reply is one response to send: its type and resources.
type reply struct {
	typ   string
	names []string
	res   []*anypb.Any
	nonce string
}

// handle is the script: it takes one request of typ (its response nonce,
// whether it is a NACK, and for EDS the names the stream newly asks for)
// and returns the responses to send.
func (st *scriptState) handle(typ, nonce string, nack bool, newEDS []string) ([]reply, error) {
	if nonce != "" && !nack && st.sent[typ].nonce == nonce {
		st.acked[typ] = st.sent[typ]
		if typ == resourcev3.EndpointType {
			for _, n := range st.sent[typ].names {
				st.held[n] = true
			}
			if st.step == 1 && slices.Contains(st.sent[typ].names, scriptA) {
				st.resendA = false
			}
		}
	}
	var out []reply
	add := func(typ string, names []string) error {
		r := reply{typ: typ, names: names}
		for _, n := range names {
			var m proto.Message = scriptAssignment(n)
			if typ == resourcev3.ClusterType {
				m = scriptClusters(st.step)[slices.Index(names, n)]
			}
			a, err := anypb.New(m)
			if err != nil {
				return err
			}
			r.res = append(r.res, a)
		}
		st.nonce++
		r.nonce = fmt.Sprintf("n%d", st.nonce)
		st.sent[typ] = sent{nonce: r.nonce, step: st.step, names: names}
		out = append(out, r)
		return nil
	}
	clusterNames := func() []string {
		var names []string
		for _, c := range scriptClusters(st.step) {
			names = append(names, c.GetName())
		}
		return names
	}
	switch {
	case typ == resourcev3.ClusterType && nonce == "":
		if err := add(typ, clusterNames()); err != nil {
			return nil, err
		}
	case typ == resourcev3.EndpointType && len(newEDS) > 0:
		names := slices.Clone(newEDS)
		if st.resendA && !slices.Contains(names, scriptA) {
			names = append(names, scriptA)
		}
		slices.Sort(names)
		if err := add(typ, names); err != nil {
			return nil, err
		}
	}
	if st.step == 0 && st.acked[resourcev3.ClusterType].nonce != "" && st.held[scriptA] && st.held[scriptB] {
		st.step, st.resendA = 1, true
		if err := add(resourcev3.ClusterType, clusterNames()); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ended reports whether the stream ACKed step 1's clusters and, after
// them, a, b, c and a's resent assignment.
func (st *scriptState) ended() bool {
	return st.step == 1 && st.acked[resourcev3.ClusterType].step == 1 && !st.resendA &&
		st.held[scriptA] && st.held[scriptB] && st.held[scriptC]
}

func kindOf(nonce string, nack bool) string {
	switch {
	case nonce == "":
		return "request"
	case nack:
		return "NACK"
	}
	return "ACK"
}

func (s *scriptADS) StreamAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	st := newScriptState()
	asked := map[string][]string{} // type → the names of its last request
	for {
		req, err := stream.Recv()
		if err != nil {
			return err
		}
		typ, nack := req.GetTypeUrl(), req.GetErrorDetail() != nil
		names := slices.Sorted(slices.Values(req.GetResourceNames()))
		r := request{typ: short(typ), kind: kindOf(req.GetResponseNonce(), nack), names: names,
			node: req.GetNode() != nil, bytes: proto.Size(req), nodeB: proto.Size(req.GetNode()), nodeMsg: req.GetNode()}
		if len(r.names) == 0 {
			r.names = []string{"*"}
		}
		s.record(r)
		// SotW EDS: a request whose names differ from the last one's
		// (an ACK may carry them) is answered with every name.
		var newEDS []string
		if typ == resourcev3.EndpointType && (req.GetResponseNonce() == "" || !slices.Equal(asked[typ], names)) {
			newEDS = names
		}
		asked[typ] = names
		replies, err := st.handle(typ, req.GetResponseNonce(), nack, newEDS)
		if err != nil {
			return err
		}
		for _, rp := range replies {
			if err := stream.Send(&discoveryv3.DiscoveryResponse{TypeUrl: rp.typ, VersionInfo: fmt.Sprint(st.step + 1),
				Nonce: rp.nonce, Resources: rp.res}); err != nil {
				return err
			}
		}
		if st.ended() {
			s.once.Do(func() { close(s.done) })
		}
	}
}

func (s *scriptADS) DeltaAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	st := newScriptState()
	for {
		req, err := stream.Recv()
		if err != nil {
			return err
		}
		typ, nack := req.GetTypeUrl(), req.GetErrorDetail() != nil
		r := request{typ: short(typ), kind: kindOf(req.GetResponseNonce(), nack),
			node: req.GetNode() != nil, bytes: proto.Size(req), nodeB: proto.Size(req.GetNode()), nodeMsg: req.GetNode()}
		sub := slices.Sorted(slices.Values(req.GetResourceNamesSubscribe()))
		for _, n := range sub {
			r.names = append(r.names, "+"+n)
		}
		for _, n := range slices.Sorted(slices.Values(req.GetResourceNamesUnsubscribe())) {
			r.names = append(r.names, "-"+n)
		}
		if len(r.names) == 0 {
			r.names = []string{"·"}
		}
		s.record(r)
		var newEDS []string
		if typ == resourcev3.EndpointType {
			newEDS = sub
		}
		replies, err := st.handle(typ, req.GetResponseNonce(), nack, newEDS)
		if err != nil {
			return err
		}
		for _, rp := range replies {
			resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: rp.typ, SystemVersionInfo: fmt.Sprint(st.step + 1), Nonce: rp.nonce}
			for i, a := range rp.res {
				resp.Resources = append(resp.Resources, &discoveryv3.Resource{Name: rp.names[i], Version: fmt.Sprintf("%d-%d", st.step+1, i), Resource: a})
			}
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
		if st.ended() {
			s.once.Do(func() { close(s.done) })
		}
	}
}

// serveScript starts a scriptADS on loopback; it stops with the test.
func serveScript(t *testing.T) (*scriptADS, string) {
	t.Helper()
	srv := newScriptADS()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return srv, lis.Addr().String()
}

func waitScript(t *testing.T, srv *scriptADS, what string) []string {
	t.Helper()
	select {
	case <-srv.done:
	case <-time.After(time.Minute):
		t.Fatalf("%s did not finish the script in a minute; it asked:\n%s", what, strings.Join(srv.lines(), "\n"))
	}
	return srv.lines()
}

// simulatedScript runs one simulated envoy-shape stream through the script.
func simulatedScript(t *testing.T, delta bool) []string {
	t.Helper()
	return simulatedScriptServer(t, delta, false).lines()
}

// simulatedScriptServer runs one simulated envoy-shape stream (with
// --delta-node-every-request when every) through the script and returns
// the server that recorded it.
func simulatedScriptServer(t *testing.T, delta, every bool) *scriptADS {
	t.Helper()
	srv, addr := serveScript(t)
	cfg := defaultConfig()
	cfg.Members, cfg.Services, cfg.Endpoints, cfg.Streams = 1, 1, 1, 1
	cfg.Shape, cfg.Delta, cfg.DeltaNodeEveryRequest = shapeEnvoy, delta, every
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	l := newLayout(cfg)
	l.services[0].cluster = scriptA // the stream converges on the script's a
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := newFleet(ctx, addr, cfg, l)
	defer f.close()
	if err := f.connect(1, time.Minute, t.Logf); err != nil {
		t.Fatal(err)
	}
	waitScript(t, srv, "the simulated envoy stream")
	return srv
}

// realEnvoyScript runs a real Envoy, bootstrapped as hubbench's real fleet
// is, through the script; it returns the requests and the Envoy's node.
func realEnvoyScript(t *testing.T, delta bool) ([]string, *corev3.Node) {
	t.Helper()
	srv, addr := serveScript(t)
	boot, err := realEnvoyBootstrap(0, memberID(0), addr, "", delta, nil)
	if err != nil {
		t.Fatal(err)
	}
	envoy.StartT(t, envoy.Options{Bootstrap: boot})
	lines := waitScript(t, srv, "the real Envoy")
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return lines, srv.node
}

func recordingPath(delta bool) string {
	proto := map[bool]string{false: "sotw", true: "delta"}[delta]
	return filepath.Join("testdata", fmt.Sprintf("envoy-%s-%s.txt", envoy.Version, proto))
}

func readRecording(t *testing.T, delta bool) []string {
	t.Helper()
	b, err := os.ReadFile(recordingPath(delta))
	if err != nil {
		t.Fatalf("%v (record it with -record-envoy and a real Envoy)", err)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// lineBytes is the request size a recording line notes.
func lineBytes(line string) int {
	var n, node int
	_, info, _ := strings.Cut(line, " # ")
	fmt.Sscanf(info, "%d bytes, node %d bytes", &n, &node)
	return n
}

// compareRecordings fails the test when two request streams differ in
// anything but their sizes, or a request's size by more than 2 % (the
// envoy shape's node metadata is not byte for byte the real Envoy's).
func compareRecordings(t *testing.T, what string, got, want []string) {
	t.Helper()
	same := len(got) == len(want)
	for i := 0; same && i < len(got); i++ {
		g, w := lineBytes(got[i]), lineBytes(want[i])
		same = compared(got[i]) == compared(want[i]) && 50*max(g-w, w-g) <= w
	}
	if !same {
		t.Errorf("%s drifted from the recording of Envoy %s.\ngot:\n  %s\nrecorded:\n  %s", what, envoy.Version,
			strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// TestEnvoyShapeMatchesRecording: the simulated envoy shape asks what the
// recorded real Envoy asked, in its order, with the node on the same
// requests, each request within 2 % of its size (no Envoy needed).
func TestEnvoyShapeMatchesRecording(t *testing.T) {
	for _, delta := range []bool{false, true} {
		t.Run(map[bool]string{false: "SotW", true: "Delta"}[delta], func(t *testing.T) {
			compareRecordings(t, "the simulated envoy shape", simulatedScript(t, delta), readRecording(t, delta))
		})
	}
}

// TestEnvoyShapeMatchesRealEnvoy: the real Envoy still asks what its
// recording says, and still sends the node the envoy shape sends (its
// extensions, build version and client features), so the recording, and
// through TestEnvoyShapeMatchesRecording the shape, stand for it. With
// -record-envoy it rewrites the recordings and envoy-<version>-node.json
// instead.
func TestEnvoyShapeMatchesRealEnvoy(t *testing.T) {
	envoy.BinaryT(t)
	for _, delta := range []bool{false, true} {
		t.Run(map[bool]string{false: "SotW", true: "Delta"}[delta], func(t *testing.T) {
			got, node := realEnvoyScript(t, delta)
			t.Logf("Envoy %s asked:\n  %s", envoy.Version, strings.Join(got, "\n  "))
			if *recordEnvoy {
				head := fmt.Sprintf("# The request stream of a real Envoy %s (ADS %s, set_node_on_first_message_only, the\n"+
					"# bootstrap of hubbench's real fleet) served the script of cmd/hubbench/envoydrift_test.go.\n"+
					"# type kind names node # sizes (not compared)\n", envoy.Version, map[bool]string{false: "SotW", true: "Delta"}[delta])
				if err := os.WriteFile(recordingPath(delta), []byte(head+strings.Join(got, "\n")+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				compact, err := protojson.Marshal(envoyNodeShared(node))
				if err != nil {
					t.Fatal(err)
				}
				var b bytes.Buffer // protojson's own spacing changes from run to run
				if err := json.Indent(&b, compact, "", " "); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(envoyNodeFile, append(b.Bytes(), '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			compareRecordings(t, "the real Envoy", got, readRecording(t, delta))
			if want := envoyNodeShared(envoyNode(0, memberID(0), "")); !proto.Equal(envoyNodeShared(node), want) {
				t.Errorf("the real Envoy's node (%d bytes without metadata) is not the envoy shape's (%d bytes): record it again with -record-envoy",
					proto.Size(envoyNodeShared(node)), proto.Size(want))
			}
		})
	}
}
