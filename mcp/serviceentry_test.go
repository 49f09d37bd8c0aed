package mcp

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/hubmesh/hub/clusters"
)

func TestProtocolOf(t *testing.T) {
	for _, tc := range []struct {
		port clusters.ServicePort
		want string
	}{
		{clusters.ServicePort{Name: "http", Protocol: "TCP"}, "HTTP"},
		{clusters.ServicePort{Name: "http-web", Protocol: "TCP"}, "HTTP"},
		{clusters.ServicePort{Name: "HTTP2-x", Protocol: "TCP"}, "HTTP2"},
		{clusters.ServicePort{Name: "grpc-api", Protocol: "TCP"}, "GRPC"},
		{clusters.ServicePort{Name: "grpc-web-ui", Protocol: "TCP"}, "GRPC-Web"},
		{clusters.ServicePort{Name: "tls-db", Protocol: "TCP"}, "TLS"},
		{clusters.ServicePort{Name: "https", Protocol: "TCP"}, "HTTPS"},
		{clusters.ServicePort{Name: "mongo", Protocol: "TCP"}, "Mongo"},
		{clusters.ServicePort{Name: "redis-main", Protocol: "TCP"}, "Redis"},
		{clusters.ServicePort{Name: "mysql", Protocol: "TCP"}, "MySQL"},
		{clusters.ServicePort{Name: "metrics", Protocol: "TCP"}, "TCP"},
		{clusters.ServicePort{Protocol: "TCP"}, "TCP"},
		{clusters.ServicePort{Name: "http", Protocol: "UDP"}, "UDP"},
		{clusters.ServicePort{Name: "web", Protocol: "TCP", AppProtocol: "http"}, "HTTP"},
		{clusters.ServicePort{Name: "tcp-x", Protocol: "TCP", AppProtocol: "grpc"}, "GRPC"}, // appProtocol wins
		{clusters.ServicePort{Name: "web", Protocol: "TCP", AppProtocol: "kubernetes.io/h2c"}, "HTTP2"},
		{clusters.ServicePort{Name: "web", Protocol: "TCP", AppProtocol: "kubernetes.io/ws"}, "HTTP"},
		{clusters.ServicePort{Name: "web", Protocol: "TCP", AppProtocol: "kubernetes.io/wss"}, "HTTPS"},
		{clusters.ServicePort{Name: "http", Protocol: "TCP", AppProtocol: "example.com/custom"}, "HTTP"}, // unknown appProtocol: the name
	} {
		if got := protocolOf(tc.port); got != tc.want {
			t.Errorf("protocolOf(%+v) = %q, want %q", tc.port, got, tc.want)
		}
	}
}

func TestBuildServiceEntry(t *testing.T) {
	west := &clusters.Service{
		Namespace: "demo", Name: "echo",
		Ports: []clusters.ServicePort{
			{Name: "http", Port: 8080, Protocol: "TCP"},
			{Name: "api", Port: 9090, Protocol: "TCP", AppProtocol: "grpc"},
		},
		Endpoints: []clusters.Endpoint{
			{Address: "10.1.0.2", Port: 18080, ServicePort: 8080, Region: "eu", Zone: "eu-1a"},
			{Address: "10.1.0.1", Port: 18080, ServicePort: 8080, Region: "eu", Zone: "eu-1b"},
			{Address: "10.1.0.1", Port: 19090, ServicePort: 9090, Region: "eu", Zone: "eu-1b"},
			{Address: "10.1.0.3", Port: 18080, ServicePort: 8080, Health: clusters.Draining}, // not ready: left out
		},
	}
	east := &clusters.Service{
		Namespace: "demo", Name: "echo",
		Ports: []clusters.ServicePort{
			{Name: "http-alt", Port: 8080, Protocol: "TCP"}, // east is first in ID order: it names port 8080
			{Port: 7070, Protocol: "TCP"},                   // unnamed
		},
		Endpoints: []clusters.Endpoint{
			{Address: "10.2.0.1", Port: 8080, ServicePort: 8080, Zone: "us-1a"},
			{Address: "10.2.0.1", Port: 7070, ServicePort: 7070, Zone: "us-1a"},
		},
	}
	west.Network = "net-west"
	got := buildServiceEntry(map[string]*clusters.Service{"west": west, "east": east}, "clusterset.local", "", "")
	if got.namespace != "demo" || got.name != "hub-echo" {
		t.Errorf("object %s/%s, want demo/hub-echo", got.namespace, got.name)
	}
	if got.labels[LabelManagedBy] != ManagedBy || len(got.labels) != 1 {
		t.Errorf("labels %v, want only %s=%s", got.labels, LabelManagedBy, ManagedBy)
	}
	// Members in ID order: east names port 8080 (http-alt), west adds 9090.
	want := &networking.ServiceEntry{
		Hosts:      []string{"echo.demo.svc.clusterset.local"},
		Location:   networking.ServiceEntry_MESH_INTERNAL,
		Resolution: networking.ServiceEntry_STATIC,
		Ports: []*networking.ServicePort{
			{Number: 7070, Protocol: "TCP", Name: "port-7070"},
			{Number: 8080, Protocol: "HTTP", Name: "http-alt"},
			{Number: 9090, Protocol: "GRPC", Name: "api"},
		},
		Endpoints: []*networking.WorkloadEntry{
			{Address: "10.2.0.1", Ports: map[string]uint32{"http-alt": 8080, "port-7070": 7070}, Labels: map[string]string{LabelCluster: "east"}, Locality: "/us-1a"},
			{Address: "10.1.0.1", Ports: map[string]uint32{"http-alt": 18080, "api": 19090}, Labels: map[string]string{LabelCluster: "west"}, Locality: "eu/eu-1b", Network: "net-west"},
			{Address: "10.1.0.2", Ports: map[string]uint32{"http-alt": 18080}, Labels: map[string]string{LabelCluster: "west"}, Locality: "eu/eu-1a", Network: "net-west"},
		},
	}
	if !proto.Equal(want, got.spec) {
		t.Errorf("ServiceEntry =\n%s\nwant\n%s", prototext.Format(got.spec), prototext.Format(want))
	}
}

func TestBuildServiceEntryExportOptOut(t *testing.T) {
	svc := func(member string, notExported bool) *clusters.Service {
		return &clusters.Service{
			Namespace: "demo", Name: "echo", NotExported: notExported,
			Ports:     []clusters.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}},
			Endpoints: []clusters.Endpoint{{Address: "10.0.0." + member, Port: 80, ServicePort: 80}},
		}
	}
	got := buildServiceEntry(map[string]*clusters.Service{"1": svc("1", false), "2": svc("2", true)}, "clusterset.local", "", "")
	if len(got.spec.Endpoints) != 1 || got.spec.Endpoints[0].Address != "10.0.0.1" {
		t.Errorf("endpoints %v, want only member 1's (member 2 opted out)", got.spec.Endpoints)
	}
	if se := buildServiceEntry(map[string]*clusters.Service{"2": svc("2", true)}, "clusterset.local", "", ""); se != nil {
		t.Errorf("every member opted out: got %v, want no ServiceEntry", se.spec)
	}
	if se := buildServiceEntry(map[string]*clusters.Service{"1": {Namespace: "demo", Name: "headless"}}, "clusterset.local", "", ""); se != nil {
		t.Errorf("a Service without ports: got %v, want no ServiceEntry", se.spec)
	}
	if se := buildServiceEntry(nil, "clusterset.local", "", ""); se != nil {
		t.Errorf("no member: got %v, want no ServiceEntry", se.spec)
	}
}

func TestBuildServiceEntryDeterministic(t *testing.T) {
	svc := &clusters.Service{
		Namespace: "demo", Name: "echo",
		Ports: []clusters.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}, {Name: "grpc", Port: 90, Protocol: "TCP"}},
	}
	for i := range 50 {
		addr := "10.0.0." + string(rune('0'+i%10)) + string(rune('0'+i/10))
		svc.Endpoints = append(svc.Endpoints, clusters.Endpoint{Address: addr, Port: 80, ServicePort: 80}, clusters.Endpoint{Address: addr, Port: 90, ServicePort: 90})
	}
	first, err := contentVersion(buildServiceEntry(map[string]*clusters.Service{"a": svc, "b": svc}, "x", "", ""))
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		v, err := contentVersion(buildServiceEntry(map[string]*clusters.Service{"a": svc, "b": svc}, "x", "", ""))
		if err != nil {
			t.Fatal(err)
		}
		if v != first {
			t.Fatalf("version %s, then %s, for the same content", first, v)
		}
	}
}

// TestServiceEntryVerifiesTheDestinationsIdentity: the ServiceEntry names
// the identities of the offered views' workloads (their mesh pods'
// service accounts), so that a sidecar fails the handshake with anything
// else, a gateway terminating TLS included; none when a view names none.
func TestServiceEntryVerifiesTheDestinationsIdentity(t *testing.T) {
	view := func(sas ...string) *clusters.Service {
		return &clusters.Service{Namespace: "demo", Name: "echo", Ports: []clusters.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}},
			PodServiceAccounts: sas}
	}
	se := buildServiceEntry(map[string]*clusters.Service{"west": view("echo"), "east": view("echo", "echo-v2")}, "clusterset.local", "example.org", "")
	if want := []string{"spiffe://example.org/ns/demo/sa/echo", "spiffe://example.org/ns/demo/sa/echo-v2"}; !slices.Equal(se.spec.GetSubjectAltNames(), want) {
		t.Errorf("subjectAltNames %v, want %v", se.spec.GetSubjectAltNames(), want)
	}
	limited := view("secret-sa")
	limited.ExportTo = []string{"north"}
	se = buildServiceEntry(map[string]*clusters.Service{"west": view("echo"), "east": limited}, "clusterset.local", "example.org", "")
	if want := []string{"spiffe://example.org/ns/demo/sa/echo"}; !slices.Equal(se.spec.GetSubjectAltNames(), want) {
		t.Errorf("subjectAltNames with a view not offered %v, want %v (the offered views' only)", se.spec.GetSubjectAltNames(), want)
	}
	silent := view()
	silent.Endpoints = []clusters.Endpoint{{Address: "10.0.0.1", Port: 8080, ServicePort: 80, Health: clusters.Healthy}}
	se = buildServiceEntry(map[string]*clusters.Service{"west": view("echo"), "east": silent}, "clusterset.local", "example.org", "")
	if sans := se.spec.GetSubjectAltNames(); sans != nil {
		t.Errorf("subjectAltNames %v with a view whose endpoints name no identity; want none", sans)
	}
}
