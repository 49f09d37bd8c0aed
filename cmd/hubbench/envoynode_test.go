package main

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/proto"
)

// TestEnvoyNodeSize: the envoy shape's node is as large as the recorded
// real Envoy 1.40's (63 KB with 516 extensions).
func TestEnvoyNodeSize(t *testing.T) {
	n := envoyNode(7, "m01", "")
	size := proto.Size(n)
	if size < 55_000 || size > 75_000 {
		t.Errorf("the envoy node has %d bytes, want about 63 KB", size)
	}
	if e := len(n.GetExtensions()); e < 400 {
		t.Errorf("the envoy node lists %d extensions, want the recorded Envoy's 516", e)
	}
	if v := n.GetUserAgentBuildVersion().GetVersion(); n.GetUserAgentName() != "envoy" || v.GetMajorNumber() != 1 || v.GetMinorNumber() != 40 {
		t.Errorf("user agent %q %v, want envoy 1.40", n.GetUserAgentName(), v)
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

// TestEnvoyNodeEveryDeltaRequest: with --delta-node-every-request every
// Delta request of the envoy shape, ACKs included, carries
// the whole node; without it (the default) only the first does; SotW
// sends it once.
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
	for _, tc := range []struct {
		name         string
		delta, every bool
	}{{"Delta/every", true, true}, {"Delta/first-only", true, false}, {"SotW", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := simulatedScriptServer(t, tc.delta, tc.every)
			srv.mu.Lock()
			defer srv.mu.Unlock()
			acks := 0
			for i, r := range srv.reqs {
				check(t, i, r.nodeMsg, tc.delta && tc.every)
				if r.kind == "ACK" {
					acks++
				}
			}
			if acks < 4 {
				t.Errorf("%d ACKs recorded, want at least 4", acks)
			}
		})
	}
}
