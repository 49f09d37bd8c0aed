package clusters

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// syntheticView builds services with endpoints spread over them, as an
// endpoint controller would deliver them: addresses from a pseudo-random
// pod range, two ports on some services, localities from a few zones.
func syntheticView(services, endpoints int, seed uint64) []*Service {
	rng := rand.New(rand.NewPCG(seed, 7))
	out := make([]*Service, 0, services)
	for i := range services {
		s := &Service{Namespace: fmt.Sprintf("team-%d", i%25), Name: fmt.Sprintf("svc-%04d", i),
			Ports: []ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}}, NotExported: i%7 == 3}
		if i%3 == 0 {
			s.Created = time.Unix(1_700_000_000+int64(i)*3600, 0).UTC()
		}
		if i%4 == 0 {
			s.Ports = append(s.Ports, ServicePort{Name: "grpc", Port: 9090, Protocol: "TCP", AppProtocol: "grpc"})
		}
		out = append(out, s)
	}
	for i := range endpoints {
		s := out[i%services]
		p := s.Ports[(i/services)%len(s.Ports)]
		zone := fmt.Sprintf("eu-west-1%c", 'a'+rune(rng.IntN(3)))
		h := Healthy
		if rng.IntN(50) == 0 {
			h = Draining
		}
		s.Endpoints = append(s.Endpoints, Endpoint{
			Address: fmt.Sprintf("10.%d.%d.%d", rng.IntN(16), rng.IntN(256), 1+rng.IntN(254)),
			Port:    8000 + p.Port%1000, ServicePort: p.Port, Health: h, Region: "eu-west-1", Zone: zone,
		})
	}
	return out
}

func TestViewCodecRoundTrip(t *testing.T) {
	view := syntheticView(50, 400, 1)
	view = append(view, &Service{Namespace: "a", Name: "no-ports"}, &Service{Namespace: "a", Name: "no-endpoints",
		Ports: []ServicePort{{Port: 53, Protocol: "UDP"}}},
		&Service{Namespace: "a", Name: "identities", KubernetesServiceAccounts: []string{"echo"}, CanonicalServiceAccounts: []string{"spiffe://x.org/ns/a/sa/b"}})
	gateways := []Gateway{{Address: "203.0.113.7", Port: 15443, Source: "service istio-system/eastwest"}, {Address: "2001:db8::1", Port: 443, Source: "secret annotation"}}
	for _, name := range []string{"gw-1", "gw-2"} {
		view = append(view, &Service{Namespace: "b", Name: name, Network: "net-1", Gateways: gateways, Ports: []ServicePort{{Port: 80, Protocol: "TCP"}},
			Endpoints: []Endpoint{{Address: "10.0.0.1", Port: 8080, ServicePort: 80, MTLS: true, Workload: "echo-v1;b;echo;v1"}, {Address: "10.0.0.2", Port: 8080, ServicePort: 80}}})
	}
	if err := validateView(view, time.Now(), 0); err != nil {
		t.Fatalf("the synthetic view is not valid: %v", err)
	}
	data, sum, err := encodeView(view)
	if err != nil {
		t.Fatal(err)
	}
	// The order services arrive in does not change the encoding.
	shuffled := append([]*Service(nil), view...)
	rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	data2, sum2, err := encodeView(shuffled)
	if err != nil {
		t.Fatal(err)
	}
	if sum != sum2 || !bytes.Equal(data, data2) {
		t.Fatalf("the same view encoded differently")
	}
	got, err := decodeView(data)
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[ServiceKey]*Service{}
	for _, s := range got {
		byKey[ServiceKey{Namespace: s.Namespace, Name: s.Name}] = s
	}
	for _, s := range view {
		if g := byKey[ServiceKey{Namespace: s.Namespace, Name: s.Name}]; !reflect.DeepEqual(g, s) {
			t.Fatalf("decoded %+v; want %+v", g, s)
		}
	}
	if len(got) != len(view) {
		t.Fatalf("decoded %d services; want %d", len(got), len(view))
	}
	if gw1, gw2 := byKey[ServiceKey{Namespace: "b", Name: "gw-1"}], byKey[ServiceKey{Namespace: "b", Name: "gw-2"}]; &gw1.Gateways[0] != &gw2.Gateways[0] {
		t.Error("a member's gateways decode to one slice per service; want one shared")
	}
	raw, err := decompress(compress(data))
	if err != nil || !bytes.Equal(raw, data) {
		t.Fatalf("gzip round trip: %v", err)
	}
	if _, err := decodeView([]byte(`{"v":2,"s":[]}`)); err == nil {
		t.Errorf("a view of an unknown format was accepted")
	}
}

func TestSplitChunks(t *testing.T) {
	for _, n := range []int{0, 1, 9, 10, 11, 35} {
		data := bytes.Repeat([]byte{'x'}, n)
		parts := splitChunks(data, 10)
		if want := max(1, (n+9)/10); len(parts) != want {
			t.Errorf("%d bytes: %d chunks; want %d", n, len(parts), want)
		}
		if !bytes.Equal(bytes.Join(parts, nil), data) {
			t.Errorf("%d bytes: chunks do not join back", n)
		}
	}
}

func TestMemberKeysDoNotCollide(t *testing.T) {
	a, b := memberKey("a_b.x"), memberKey("a-b.x")
	if a == b || len(a) != 52 || len(a) > 63 {
		t.Fatalf("keys %q and %q", a, b)
	}
}
