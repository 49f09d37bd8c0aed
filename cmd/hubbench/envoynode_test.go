package main

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// TestEnvoyNodeSize: the envoy shape's node is as large as an Istio
// sidecar's (11–23 KB, push-floor.md §1) with ~130 extensions.
func TestEnvoyNodeSize(t *testing.T) {
	n := envoyNode(7, "m01", "")
	size := proto.Size(n)
	if size < 11_000 || size > 23_000 {
		t.Errorf("the envoy node has %d bytes, want 11–23 KB", size)
	}
	if e := len(n.GetExtensions()); e < 120 || e > 160 {
		t.Errorf("the envoy node lists %d extensions, want about 130", e)
	}
	md := n.GetMetadata().GetFields()
	for _, k := range []string{"CLUSTER_ID", "NAMESPACE", "ISTIO_VERSION", "LABELS", "PROXY_CONFIG", "INSTANCE_IPS"} {
		if _, ok := md[k]; !ok {
			t.Errorf("node metadata lacks %s", k)
		}
	}
	if md["CLUSTER_ID"].GetStringValue() != "m01" {
		t.Errorf("CLUSTER_ID %q, want m01", md["CLUSTER_ID"].GetStringValue())
	}
	t.Logf("envoy node: %d bytes, %d extensions, %d bytes of metadata", size, len(n.GetExtensions()), proto.Size(n.GetMetadata()))
}

// recordingADS is a real gRPC ADS server that serves one EDS cluster and
// its assignment, and records every request it receives.
type recordingADS struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	cluster string

	mu    sync.Mutex
	delta []*discoveryv3.DeltaDiscoveryRequest
	sotw  []*discoveryv3.DiscoveryRequest
	// done is closed when the EDS response was ACKed.
	done     chan struct{}
	doneOnce sync.Once
}

// reply is what the fake answers a request of typeURL with ackNonce: the
// CDS or EDS resource (and its nonce) for a subscription, nothing for an
// ACK; the EDS ACK ends the exchange.
func (r *recordingADS) reply(typeURL, ackNonce string, cds, eds *anypb.Any) (*anypb.Any, string) {
	switch {
	case ackNonce == "eds":
		r.doneOnce.Do(func() { close(r.done) })
	case ackNonce != "":
	case typeURL == resourcev3.ClusterType:
		return cds, "cds"
	case typeURL == resourcev3.EndpointType:
		return eds, "eds"
	}
	return nil, ""
}

func (r *recordingADS) DeltaAggregatedResources(st discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	cds, eds, err := r.encoded()
	if err != nil {
		return err
	}
	for {
		req, err := st.Recv()
		if err != nil {
			return err
		}
		r.mu.Lock()
		r.delta = append(r.delta, req)
		r.mu.Unlock()
		res, nonce := r.reply(req.GetTypeUrl(), req.GetResponseNonce(), cds, eds)
		if res == nil {
			continue
		}
		if err := st.Send(&discoveryv3.DeltaDiscoveryResponse{TypeUrl: req.GetTypeUrl(), Nonce: nonce, SystemVersionInfo: "1",
			Resources: []*discoveryv3.Resource{{Name: r.cluster, Version: "1", Resource: res}}}); err != nil {
			return err
		}
	}
}

func (r *recordingADS) StreamAggregatedResources(st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	cds, eds, err := r.encoded()
	if err != nil {
		return err
	}
	for {
		req, err := st.Recv()
		if err != nil {
			return err
		}
		r.mu.Lock()
		r.sotw = append(r.sotw, req)
		r.mu.Unlock()
		res, nonce := r.reply(req.GetTypeUrl(), req.GetResponseNonce(), cds, eds)
		if res == nil {
			continue
		}
		if err := st.Send(&discoveryv3.DiscoveryResponse{TypeUrl: req.GetTypeUrl(), Nonce: nonce, VersionInfo: "1", Resources: []*anypb.Any{res}}); err != nil {
			return err
		}
	}
}

func (r *recordingADS) encoded() (cds, eds *anypb.Any, err error) {
	if cds, err = anypb.New(&clusterv3.Cluster{Name: r.cluster, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads, ServiceName: r.cluster}}); err != nil {
		return nil, nil, err
	}
	eds, err = anypb.New(&endpointv3.ClusterLoadAssignment{ClusterName: r.cluster})
	return cds, eds, err
}

// runOneEnvoyStream connects one envoy-shape stream to a recording ADS
// server and returns the server once the stream ACKed its EDS response.
func runOneEnvoyStream(t *testing.T, delta, everyRequest bool) *recordingADS {
	t.Helper()
	cfg := defaultConfig()
	cfg.Members, cfg.Services, cfg.Endpoints, cfg.Streams = 1, 1, 1, 1
	cfg.Shape, cfg.Delta, cfg.DeltaNodeEveryRequest = shapeEnvoy, delta, everyRequest
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	l := newLayout(cfg)
	srv := &recordingADS{cluster: l.services[0].cluster, done: make(chan struct{})}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := newFleet(ctx, lis.Addr().String(), cfg, l)
	defer f.close()
	if err := f.connect(1, time.Minute, t.Logf); err != nil {
		t.Fatal(err)
	}
	select {
	case <-srv.done:
	case <-ctx.Done():
		t.Fatal("the stream did not ACK its EDS response")
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return srv
}

// TestEnvoyNodeEveryDeltaRequest: with --delta-node-every-request (the
// default) every Delta request of the envoy shape, ACKs included, carries
// the whole node; without it only the first does; SotW sends it once.
func TestEnvoyNodeEveryDeltaRequest(t *testing.T) {
	want := envoyNode(0, memberID(0), "")
	check := func(t *testing.T, i int, node *corev3.Node, every bool) {
		t.Helper()
		switch {
		case i == 0 || every:
			if !proto.Equal(node, want) {
				t.Errorf("request %d: node of %d bytes, want the envoy node (%d bytes)", i, proto.Size(node), proto.Size(want))
			}
		case node != nil:
			t.Errorf("request %d carries the node (%d bytes), want it on the first request only", i, proto.Size(node))
		}
	}
	for _, every := range []bool{true, false} {
		name := map[bool]string{true: "every", false: "first-only"}[every]
		t.Run("Delta/"+name, func(t *testing.T) {
			srv := runOneEnvoyStream(t, true, every)
			// CDS subscribe, EDS subscribe (before the CDS ACK), CDS ACK, EDS ACK.
			if len(srv.delta) < 4 {
				t.Fatalf("%d requests, want at least 4", len(srv.delta))
			}
			acks := 0
			for i, req := range srv.delta {
				check(t, i, req.GetNode(), every)
				if req.GetResponseNonce() != "" {
					acks++
				}
			}
			if acks < 2 {
				t.Errorf("%d ACKs recorded, want 2", acks)
			}
		})
	}
	t.Run("SotW", func(t *testing.T) {
		srv := runOneEnvoyStream(t, false, true)
		if len(srv.sotw) < 4 {
			t.Fatalf("%d requests, want at least 4", len(srv.sotw))
		}
		for i, req := range srv.sotw {
			check(t, i, req.GetNode(), false)
		}
	})
}
