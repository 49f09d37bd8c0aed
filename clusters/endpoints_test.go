package clusters

import (
	"log/slog"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestBuildService(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "echo"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			{Name: "grpc", Port: 80, Protocol: corev1.ProtocolTCP, AppProtocol: ptr.To("grpc")},
			{Name: "metrics", Port: 9090, Protocol: corev1.ProtocolTCP},
		}},
	}
	cond := func(ready, serving, terminating *bool) discoveryv1.EndpointConditions {
		return discoveryv1.EndpointConditions{Ready: ready, Serving: serving, Terminating: terminating}
	}
	yes, no := ptr.To(true), ptr.To(false)
	slices := []*discoveryv1.EndpointSlice{
		{
			ObjectMeta:  metav1.ObjectMeta{Name: "b-v4"},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("grpc"), Port: ptr.To[int32](8080)}},
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"10.0.0.1"}, Conditions: cond(yes, yes, no), NodeName: ptr.To("n1")},
				{Addresses: []string{"10.0.0.2"}, Conditions: cond(no, yes, yes), NodeName: ptr.To("n1"), Zone: ptr.To("z-override")},
				{Addresses: []string{"10.0.0.3"}, Conditions: cond(no, no, yes)},   // terminating, not serving: left out
				{Addresses: []string{"10.0.0.4"}, Conditions: cond(no, no, no)},    // not ready: left out
				{Addresses: []string{"10.0.0.5"}, Conditions: cond(nil, nil, nil)}, // unknown means ready
			},
		},
		{
			ObjectMeta:  metav1.ObjectMeta{Name: "a-v6"},
			AddressType: discoveryv1.AddressTypeIPv6,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("grpc"), Port: ptr.To[int32](8080)}, {Name: ptr.To("metrics"), Port: ptr.To[int32](9100)}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"fd00::1"}, Conditions: cond(yes, yes, no)}},
		},
		{
			ObjectMeta:  metav1.ObjectMeta{Name: "c-fqdn"},
			AddressType: discoveryv1.AddressTypeFQDN,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("grpc"), Port: ptr.To[int32](8080)}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"example.com"}}},
		},
	}
	nodes := map[string]map[string]string{"n1": {labelRegion: "r1", labelZone: "z1"}}
	got := buildService(svc, slices, func(n string) map[string]string { return nodes[n] }, nil)

	want := &Service{
		Namespace: "ns", Name: "echo",
		Ports: []ServicePort{
			{Name: "grpc", Port: 80, Protocol: "TCP", AppProtocol: "grpc"},
			{Name: "metrics", Port: 9090, Protocol: "TCP"},
		},
		Endpoints: []Endpoint{
			{Address: "fd00::1", Port: 8080, ServicePort: 80, Health: Healthy},
			{Address: "fd00::1", Port: 9100, ServicePort: 9090, Health: Healthy},
			{Address: "10.0.0.1", Port: 8080, ServicePort: 80, Health: Healthy, Region: "r1", Zone: "z1"},
			{Address: "10.0.0.2", Port: 8080, ServicePort: 80, Health: Draining, Region: "r1", Zone: "z-override"},
			{Address: "10.0.0.5", Port: 8080, ServicePort: 80, Health: Healthy},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("buildService =\n%+v\nwant\n%+v", got, want)
	}
}

func TestBuildServiceUnnamedPort(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	slices := []*discoveryv1.EndpointSlice{{
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Port: ptr.To[int32](8080)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.1.1.1"}}},
	}}
	got := buildService(svc, slices, nil, nil)
	if len(got.Endpoints) != 1 || got.Endpoints[0].Port != 8080 || got.Endpoints[0].ServicePort != 80 {
		t.Errorf("endpoints = %+v; want 10.1.1.1:8080 for port 80", got.Endpoints)
	}
}

func TestBuildServiceExportLabel(t *testing.T) {
	for _, tc := range []struct {
		labels map[string]string
		want   bool
	}{
		{nil, false},
		{map[string]string{LabelExport: "true"}, false},
		{map[string]string{LabelExport: "False"}, false}, // only "false" opts out, as Kubernetes labels are case-sensitive
		{map[string]string{LabelExport: "false"}, true},
	} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", Labels: tc.labels}}
		if got := buildService(svc, nil, nil, nil).NotExported; got != tc.want {
			t.Errorf("labels %v: NotExported = %v, want %v", tc.labels, got, tc.want)
		}
	}
}

// TestStoppedControllerLeavesTheSink: once a member's client is stopped
// (a successor replaced it, or it is removed), what its queue still holds
// is dropped, not handed to the Sink: the caller of stop decides what the
// Sink keeps. The queued Service here is gone from its (empty) cache, so
// handing it over would remove it from the Sink.
func TestStoppedControllerLeavesTheSink(t *testing.T) {
	sink := newRecordingSink()
	key := ServiceKey{Namespace: "default", Name: "a"}
	sink.UpdateService("west", key, &Service{Namespace: key.Namespace, Name: key.Name, Endpoints: []Endpoint{{Address: "10.0.0.1", Port: 80}}})
	in := viewInputs{services: emptyServices, health: newMemberHealth(0), net: &networkController{}}
	sc := newServiceController("west", sink, slog.New(slog.DiscardHandler), in)
	sc.enqueue(key)
	sc.stop()
	sc.run() // returns: the queue is shut down
	if sink.services["west"][key] == nil {
		t.Fatal("a stopped controller handed a queued Service to the Sink (removed it)")
	}

	// The same, not stopped: the Service is removed, as it is gone.
	sc = newServiceController("west", sink, slog.New(slog.DiscardHandler), in)
	sc.enqueue(key)
	if !sc.processNext() || sink.services["west"][key] != nil {
		t.Fatal("a running controller did not hand the Sink the removal of a Service gone from its cache")
	}
	sc.stop()
}
