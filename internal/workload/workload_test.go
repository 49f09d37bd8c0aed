package workload

import (
	"context"
	"encoding/json"
	"net/url"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

func TestPeer(t *testing.T) {
	id, _ := url.Parse("spiffe://td.test/ns/a/sa/b")
	tlsPeer := &peer.Peer{AuthInfo: credentials.TLSInfo{SPIFFEID: id}}
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want string
	}{
		{"no peer", context.Background(), "-"},
		{"plaintext", peer.NewContext(context.Background(), &peer.Peer{}), "-"},
		{"mTLS", peer.NewContext(context.Background(), tlsPeer), "spiffe://td.test/ns/a/sa/b"},
		{"TLS without an ID", peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{}}), "tls-without-spiffe-id"},
		{"behind a sidecar", metadata.NewIncomingContext(peer.NewContext(context.Background(), &peer.Peer{}),
			metadata.Pairs("x-forwarded-client-cert", `By=spiffe://td.test/ns/x/sa/server;Hash=ab;Subject="";URI=spiffe://td.test/ns/a/sa/caller`)),
			"spiffe://td.test/ns/a/sa/caller"},
	} {
		if got := Peer(tc.ctx); got != tc.want {
			t.Errorf("%s: %q; want %q", tc.name, got, tc.want)
		}
	}
	var seen string
	e := &Echo{ID: "west", OnCall: func(c string) { seen = c }}
	resp, err := e.UnaryCall(peer.NewContext(context.Background(), tlsPeer), &testgrpc.SimpleRequest{})
	if err != nil || resp.GetServerId() != "west" || resp.GetUsername() != id.String() || seen != id.String() {
		t.Errorf("UnaryCall: %v, %v; told %q", resp, err, seen)
	}
}

func TestXFCCURI(t *testing.T) {
	for xfcc, want := range map[string]string{
		"":                             "-",
		"By=spiffe://a;URI=spiffe://b": "spiffe://b",
		"By=x;URI=spiffe://first,By=y;URI=spiffe://nearest": "spiffe://nearest",
		"By=x;Hash=h": "-",
	} {
		if got := XFCCURI(xfcc); got != want {
			t.Errorf("XFCCURI(%q) = %q; want %q", xfcc, got, want)
		}
	}
}

// TestBootstrap: the fields grpc-go and Istio's grpcgen read, as
// istio-agent writes them.
func TestBootstrap(t *testing.T) {
	b := Bootstrap{XDSAddr: "127.0.0.1:15010", NodeID: NodeID("10.0.0.1", "pod", "ns"), ClusterID: "west", Namespace: "ns",
		Region: "r", Zone: "z", CertDir: "/certs", Refresh: time.Minute}
	data, err := b.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		XDSServers []struct {
			ServerURI string `json:"server_uri"`
		} `json:"xds_servers"`
		Node struct {
			ID       string            `json:"id"`
			Metadata map[string]string `json:"metadata"`
			Locality map[string]string `json:"locality"`
		} `json:"node"`
		Providers map[string]struct {
			Plugin string            `json:"plugin_name"`
			Config map[string]string `json:"config"`
		} `json:"certificate_providers"`
		Template string `json:"server_listener_resource_name_template"`
	}
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.XDSServers) != 1 || got.XDSServers[0].ServerURI != "127.0.0.1:15010" || got.Node.ID != "sidecar~10.0.0.1~pod.ns~ns.svc.cluster.local" ||
		got.Node.Metadata["CLUSTER_ID"] != "west" || got.Node.Metadata["GENERATOR"] != "grpc" || got.Node.Locality["zone"] != "z" ||
		got.Template != "xds.istio.io/grpc/lds/inbound/%s" {
		t.Errorf("bootstrap: %s", data)
	}
	p := got.Providers["default"]
	if p.Plugin != "file_watcher" || p.Config["certificate_file"] != "/certs/cert-chain.pem" || p.Config["refresh_interval"] != "60s" {
		t.Errorf("certificate provider: %+v", p)
	}
	b.CertDir, b.Region, b.Zone = "", "", ""
	var plain map[string]any
	if data, _ = b.JSON(); json.Unmarshal(data, &plain) != nil || plain["certificate_providers"] != nil {
		t.Errorf("a plaintext workload's bootstrap names a certificate provider: %s", data)
	}
}
