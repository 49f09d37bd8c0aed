// Package workload is what a proxyless gRPC workload of the mesh runs
// beside the hub, shared by the e2e tests and the demo: grpc's interop
// TestService as an echo server that answers with its ID and the caller's
// identity, and the gRPC xDS bootstrap istio-agent writes for such a
// workload.
package workload

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc/credentials"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// Echo is grpc's interop TestService answering UnaryCall with ID as
// server_id and hostname and the caller's identity (Peer) as username.
type Echo struct {
	testgrpc.UnimplementedTestServiceServer
	ID string
	// OnCall, if set, is told every UnaryCall's caller.
	OnCall func(caller string)
}

// UnaryCall answers with the server's ID and the caller's identity.
func (s *Echo) UnaryCall(ctx context.Context, _ *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	caller := Peer(ctx)
	if s.OnCall != nil {
		s.OnCall(caller)
	}
	return &testgrpc.SimpleResponse{ServerId: s.ID, Hostname: s.ID, Username: caller}, nil
}

// EmptyCall answers (a second method, for policies on gRPC methods).
func (s *Echo) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	return &testgrpc.Empty{}, nil
}

// Peer is the SPIFFE ID of the caller's verified certificate or, on a
// plaintext connection from an Istio sidecar, the one the sidecar forwards
// (X-Forwarded-Client-Cert); "-" for a plaintext caller,
// "tls-without-spiffe-id" for a TLS one without.
func Peer(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "-"
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("x-forwarded-client-cert"); len(v) > 0 {
			return XFCCURI(v[len(v)-1])
		}
		return "-"
	}
	if info.SPIFFEID != nil {
		return info.SPIFFEID.String()
	}
	return "tls-without-spiffe-id"
}

// XFCCURI is the URI (the SPIFFE ID) of the nearest hop in an
// X-Forwarded-Client-Cert header, "-" when there is none.
func XFCCURI(xfcc string) string {
	if xfcc == "" {
		return "-"
	}
	hops := strings.Split(xfcc, ",")
	for kv := range strings.SplitSeq(hops[len(hops)-1], ";") {
		if v, ok := strings.CutPrefix(kv, "URI="); ok {
			return v
		}
	}
	return "-"
}

// Bootstrap is the gRPC xDS bootstrap istio-agent writes for a proxyless
// workload (Istio's grpc-agent template): the xDS server in plaintext, the
// node Istio's grpcgen reads, and a file_watcher certificate provider
// "default" on the agent's files for mTLS.
type Bootstrap struct {
	// XDSAddr is the xDS server (host:port).
	XDSAddr string
	// NodeID is Istio's "sidecar~<ip>~<pod>.<namespace>~<namespace>.svc.cluster.local".
	NodeID string
	// ClusterID and Namespace are the node's CLUSTER_ID and NAMESPACE.
	ClusterID, Namespace string
	// Region and Zone are the node's locality (empty: none).
	Region, Zone string
	// CertDir holds cert-chain.pem, key.pem and root-cert.pem; empty: no
	// certificate provider (a plaintext workload).
	CertDir string
	// Refresh is how often grpc-go re-reads those files (zero: 15
	// minutes, what istio-agent writes).
	Refresh time.Duration
}

// NodeID is Istio's node ID of a sidecar-type proxy: the workload's
// address, pod name and namespace.
func NodeID(ip, pod, namespace string) string {
	return fmt.Sprintf("sidecar~%s~%s.%s~%s.svc.cluster.local", ip, pod, namespace, namespace)
}

// JSON is the bootstrap file's content.
func (b Bootstrap) JSON() ([]byte, error) {
	node := map[string]any{
		"id":       b.NodeID,
		"metadata": map[string]any{"CLUSTER_ID": b.ClusterID, "NAMESPACE": b.Namespace, "GENERATOR": "grpc"},
	}
	if b.Region != "" || b.Zone != "" {
		node["locality"] = map[string]any{"region": b.Region, "zone": b.Zone}
	}
	out := map[string]any{
		"xds_servers":                            []any{map[string]any{"server_uri": b.XDSAddr, "channel_creds": []any{map[string]any{"type": "insecure"}}, "server_features": []string{"xds_v3"}}},
		"node":                                   node,
		"server_listener_resource_name_template": "xds.istio.io/grpc/lds/inbound/%s",
	}
	if b.CertDir != "" {
		refresh := b.Refresh
		if refresh <= 0 {
			refresh = 15 * time.Minute
		}
		out["certificate_providers"] = map[string]any{"default": map[string]any{"plugin_name": "file_watcher", "config": map[string]any{
			"certificate_file": filepath.Join(b.CertDir, "cert-chain.pem"), "private_key_file": filepath.Join(b.CertDir, "key.pem"),
			"ca_certificate_file": filepath.Join(b.CertDir, "root-cert.pem"), "refresh_interval": fmt.Sprintf("%ds", int(refresh/time.Second)),
		}}}
	}
	return json.MarshalIndent(out, "", "  ")
}
