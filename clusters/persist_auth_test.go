package clusters

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/internal/localcluster"
)

// testViewKey authenticates the views that store-level tests write.
var testViewKey = bytes.Repeat([]byte{0x5a}, viewKeyLen)

// TestViewKeySecret: the first reader creates the key Secret with 32
// random bytes, replicas racing at first start all end up with the same
// key, and a malformed Secret is reported (without its content) and left
// as it is.
func TestViewKeySecret(t *testing.T) {
	home, ns := homeNamespace(t)
	ctx := context.Background()
	secrets := home.CoreV1().Secrets(ns)

	const replicas = 8
	keys := make([][]byte, replicas)
	errs := make([]error, replicas)
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() { keys[i], errs[i] = ensureViewKey(ctx, secrets, ns) })
	}
	wg.Wait()
	for i := range replicas {
		if errs[i] != nil {
			t.Fatalf("replica %d: %v", i, errs[i])
		}
		if len(keys[i]) != viewKeyLen || !bytes.Equal(keys[i], keys[0]) {
			t.Fatalf("replica %d got a %d-byte key that differs from replica 0's", i, len(keys[i]))
		}
	}
	if bytes.Equal(keys[0], make([]byte, viewKeyLen)) {
		t.Fatal("the generated key is all zeros")
	}
	s, err := secrets.Get(ctx, ViewKeySecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(s.Data[viewKeySecretData], keys[0]) {
		t.Fatal("the Secret does not hold the key the replicas use")
	}
	again, err := ensureViewKey(ctx, secrets, ns)
	if err != nil || !bytes.Equal(again, keys[0]) {
		t.Fatalf("reading the key again: %v (same key: %v)", err, bytes.Equal(again, keys[0]))
	}

	for name, data := range map[string]map[string][]byte{
		"short":       {viewKeySecretData: []byte("sixteen-byte-key")},
		"other key":   {"hmac": keys[0]},
		"no data":     nil,
		"long (33 B)": {viewKeySecretData: append(bytes.Clone(keys[0]), 1)},
	} {
		s.Data = data
		if s, err = secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		_, err := ensureViewKey(ctx, secrets, ns)
		if !errors.Is(err, errViewKeyMalformed) || !strings.Contains(err.Error(), ns+"/"+ViewKeySecret) {
			t.Errorf("%s: %v; want a malformed-key error naming the Secret", name, err)
		}
		if err != nil && (strings.Contains(err.Error(), "sixteen-byte-key") || strings.Contains(err.Error(), fmt.Sprintf("%x", keys[0]))) {
			t.Errorf("%s: the error quotes the Secret's content: %v", name, err)
		}
		cur, _ := secrets.Get(ctx, ViewKeySecret, metav1.GetOptions{})
		if fmt.Sprint(cur.Data) != fmt.Sprint(data) {
			t.Errorf("%s: the malformed Secret was changed", name)
		}
	}
}

// openView reads and opens the persisted view of id under key.
func openView(t *testing.T, s *viewStore, key []byte, id string) ([]*Service, bool, error) {
	t.Helper()
	v, err := s.readOne(context.Background(), id)
	if err != nil {
		return nil, false, err
	}
	if v == nil {
		t.Fatalf("no persisted view of %s", id)
	}
	return v.open(key, time.Now(), 0)
}

// wantRefused fails unless opening the view of id under key is refused as
// unauthenticated (or invalid), with an error containing msg.
func wantRefused(t *testing.T, s *viewStore, key []byte, id string, unauthenticated bool, msg string) {
	t.Helper()
	svcs, unauth, err := openView(t, s, key, id)
	if err == nil || unauth != unauthenticated || !strings.Contains(err.Error(), msg) {
		t.Fatalf("opening the view of %s = %d services, unauthenticated %v, %v; want refused (unauthenticated %v) with %q",
			id, len(svcs), unauth, err, unauthenticated, msg)
	}
}

// editManifest applies edit to the manifest of id in the API server.
func editManifest(t *testing.T, home kubernetes.Interface, ns, id string, edit func(*corev1.ConfigMap)) {
	t.Helper()
	cms := home.CoreV1().ConfigMaps(ns)
	cm, err := cms.Get(context.Background(), manifestName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	edit(cm)
	if _, err := cms.Update(context.Background(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestPersistedViewMAC: a view written with a key opens with that key,
// inline and chunked; every change to what the MAC covers, another key, no
// key, no MAC, one member's view under another's name and altered chunks
// are refused as unauthenticated; an authentic view whose content is
// invalid is refused as invalid.
func TestPersistedViewMAC(t *testing.T) {
	home, ns := homeNamespace(t)
	ctx := context.Background()
	cms := home.CoreV1().ConfigMaps(ns)
	s := &viewStore{cms: cms, chunkSize: 4 << 10}
	const server = "https://member.example"
	write := func(id string, view []*Service) {
		t.Helper()
		data, sum := mustEncode(t, view)
		if _, err := s.write(ctx, testViewKey, id, data, sum, server, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	small, large := syntheticView(3, 6, 1), syntheticView(200, 3000, 2)
	write("west", small)
	write("big", large)
	for id, want := range map[string][]*Service{"west": small, "big": large} {
		got, _, err := openView(t, s, testViewKey, id)
		if err != nil {
			t.Fatalf("opening the genuine view of %s: %v", id, err)
		}
		if err := sameServices(got, want); err != nil {
			t.Fatalf("round trip of %s: %v", id, err)
		}
	}

	wantRefused(t, s, bytes.Repeat([]byte{1}, viewKeyLen), "west", true, "MAC does not match")
	wantRefused(t, s, nil, "west", true, "view key is unavailable")

	// Each field the MAC covers, changed.
	for field, value := range map[string]string{
		viewKeyServer:    "https://elsewhere.example",
		viewKeyWrittenAt: time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano),
		viewKeySHA256:    strings.Repeat("0", 64),
		viewKeyGzSHA256:  strings.Repeat("0", 64),
	} {
		var old string
		editManifest(t, home, ns, "west", func(cm *corev1.ConfigMap) { old, cm.Data[field] = cm.Data[field], value })
		wantRefused(t, s, testViewKey, "west", true, "MAC does not match")
		editManifest(t, home, ns, "west", func(cm *corev1.ConfigMap) { cm.Data[field] = old })
	}
	if _, _, err := openView(t, s, testViewKey, "west"); err != nil {
		t.Fatalf("the restored manifest does not open: %v", err)
	}

	// Other bytes under the old MAC (the attack: 10.66.6.7 put into demo/echo).
	forged := []*Service{{Namespace: "demo", Name: "echo", Ports: []ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}},
		Endpoints: []Endpoint{{Address: "10.66.6.7", Port: 8080, ServicePort: 80}}}}
	forgedData, forgedSum := mustEncode(t, forged)
	editManifest(t, home, ns, "west", func(cm *corev1.ConfigMap) { cm.BinaryData[viewKeyData] = compress(forgedData) })
	wantRefused(t, s, testViewKey, "west", true, "compressed content has SHA-256")
	editManifest(t, home, ns, "west", func(cm *corev1.ConfigMap) { cm.Data[viewKeySHA256] = forgedSum })
	wantRefused(t, s, testViewKey, "west", true, "MAC does not match")

	// No MAC at all: a forgery, or a view of a hub before this format.
	editManifest(t, home, ns, "west", func(cm *corev1.ConfigMap) { delete(cm.Data, viewKeyMAC) })
	wantRefused(t, s, testViewKey, "west", true, "carries no MAC")

	// The genuine view of "big" copied to "east"'s name.
	write("east", small)
	bigManifest, err := cms.Get(ctx, manifestName("big"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	editManifest(t, home, ns, "east", func(cm *corev1.ConfigMap) {
		cm.Data, cm.BinaryData = bigManifest.Data, bigManifest.BinaryData
		cm.Labels[viewVersionLabel] = bigManifest.Labels[viewVersionLabel]
	})
	for _, c := range chunksOf(t, home, ns, "big") {
		c.ObjectMeta = metav1.ObjectMeta{Name: strings.Replace(c.Name, memberKey("big"), memberKey("east"), 1), Labels: c.Labels}
		c.Labels[viewLabel], c.Labels[viewClusterLabel] = memberKey("east"), "east"
		if _, err := cms.Create(ctx, &c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	wantRefused(t, s, testViewKey, "east", true, "MAC does not match")

	// A chunk of the genuine large view altered.
	c := chunksOf(t, home, ns, "big")[0]
	c.BinaryData[viewKeyData][10] ^= 0xff
	if _, err := cms.Update(ctx, &c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, s, testViewKey, "big", true, "compressed content has SHA-256")

	// A later write of the same content repairs a manifest whose MAC fails
	// instead of skipping it as already written.
	smallData, smallSum := mustEncode(t, small)
	editManifest(t, home, ns, "west", func(cm *corev1.ConfigMap) {
		cm.Data[viewKeySHA256], cm.BinaryData[viewKeyData] = smallSum, compress(smallData)
	})
	wantRefused(t, s, testViewKey, "west", true, "carries no MAC")
	write("west", small)
	if _, _, err := openView(t, s, testViewKey, "west"); err != nil {
		t.Fatalf("rewriting over a tampered manifest: %v", err)
	}

	// Authentic, but invalid: refused as invalid.
	bad := syntheticView(2, 2, 3)
	bad[1].Endpoints[0].Address = "not-an-ip"
	write("odd", bad)
	wantRefused(t, s, testViewKey, "odd", false, `address "not-an-ip" is not an IP address`)
}

// chunksOf lists the chunk ConfigMaps of id.
func chunksOf(t *testing.T, home kubernetes.Interface, ns, id string) []corev1.ConfigMap {
	t.Helper()
	list, err := home.CoreV1().ConfigMaps(ns).List(context.Background(), metav1.ListOptions{
		LabelSelector: viewLabel + "=" + memberKey(id) + "," + viewRoleLabel + "=" + viewRoleChunk})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) == 0 {
		t.Fatalf("%s has no chunks", id)
	}
	return list.Items
}

// TestValidateService refuses each kind of invalid service, and accepts
// what buildService and the codec produce.
func TestValidateService(t *testing.T) {
	now := time.Now()
	valid := func() *Service {
		return &Service{Namespace: "demo", Name: "echo", Created: now.Add(-time.Hour).Truncate(time.Second),
			Ports: []ServicePort{{Name: "http", Port: 80, Protocol: "TCP", AppProtocol: "kubernetes.io/h2c"}, {Name: "dns", Port: 53, Protocol: "UDP"}},
			Endpoints: []Endpoint{{Address: "10.1.2.3", Port: 8080, ServicePort: 80, Region: "eu", Zone: "eu-1a"},
				{Address: "fd00::1", Port: 53, ServicePort: 53, Health: Draining}},
			Network: "net-1", KubernetesServiceAccounts: []string{"a", "b"}, CanonicalServiceAccounts: []string{"spiffe://td/ns/demo/sa/a"}}
	}
	if err := validateService(valid(), now); err != nil {
		t.Fatalf("a valid service: %v", err)
	}
	if err := validateView(syntheticView(100, 1000, 9), now, 0); err != nil {
		t.Fatalf("a synthetic view: %v", err)
	}
	tooMany := make([]string, MaxDeclaredServiceAccounts+1)
	for i := range tooMany {
		tooMany[i] = fmt.Sprintf("sa-%03d", i)
	}
	cases := map[string]struct {
		edit func(*Service)
		want string
	}{
		"namespace not DNS-1123":   {func(s *Service) { s.Namespace = "Demo_ns" }, "namespace"},
		"empty name":               {func(s *Service) { s.Name = "" }, "name"},
		"long name":                {func(s *Service) { s.Name = strings.Repeat("a", 64) }, "name"},
		"created before 1970":      {func(s *Service) { s.Created = time.Unix(-10, 0).UTC() }, "creation time"},
		"created in the future":    {func(s *Service) { s.Created = now.Add(48 * time.Hour) }, "creation time"},
		"port 0":                   {func(s *Service) { s.Ports[0].Port = 0 }, "port 0 is not in 1-65535"},
		"port 65536":               {func(s *Service) { s.Ports[0].Port = 65536 }, "port 65536"},
		"protocol":                 {func(s *Service) { s.Ports[0].Protocol = "HTTP" }, "protocol"},
		"port name":                {func(s *Service) { s.Ports[0].Name = "HTTP!" }, "port name"},
		"unnamed among several":    {func(s *Service) { s.Ports[1].Name = "" }, "port name"},
		"duplicate port name":      {func(s *Service) { s.Ports[1].Name = "http" }, "appears twice"},
		"duplicate port":           {func(s *Service) { s.Ports[1].Port, s.Ports[1].Protocol = 80, "TCP" }, "appears twice"},
		"appProtocol":              {func(s *Service) { s.Ports[0].AppProtocol = "no spaces/allowed here" }, "appProtocol"},
		"address":                  {func(s *Service) { s.Endpoints[0].Address = "10.66.6.300" }, "not an IP address"},
		"address with zone":        {func(s *Service) { s.Endpoints[1].Address = "fe80::1%eth0" }, "not an IP address"},
		"unspecified address":      {func(s *Service) { s.Endpoints[0].Address = "0.0.0.0" }, "unspecified, loopback or link-local"},
		"loopback address":         {func(s *Service) { s.Endpoints[0].Address = "127.0.0.1" }, "unspecified, loopback or link-local"},
		"mapped loopback":          {func(s *Service) { s.Endpoints[1].Address = "::ffff:127.0.0.1" }, "unspecified, loopback or link-local"},
		"link-local address":       {func(s *Service) { s.Endpoints[0].Address = "169.254.169.254" }, "unspecified, loopback or link-local"},
		"link-local multicast":     {func(s *Service) { s.Endpoints[1].Address = "ff02::1" }, "unspecified, loopback or link-local"},
		"target port":              {func(s *Service) { s.Endpoints[0].Port = -1 }, "target port"},
		"unknown service port":     {func(s *Service) { s.Endpoints[0].ServicePort = 81 }, "service port 81"},
		"health":                   {func(s *Service) { s.Endpoints[0].Health = 7 }, "health"},
		"zone":                     {func(s *Service) { s.Endpoints[0].Zone = "eu 1a" }, "zone"},
		"region":                   {func(s *Service) { s.Endpoints[0].Region = strings.Repeat("r", 64) }, "region"},
		"network":                  {func(s *Service) { s.Network = "-net" }, "network"},
		"too many accounts":        {func(s *Service) { s.KubernetesServiceAccounts = tooMany }, "at most 32"},
		"unsorted accounts":        {func(s *Service) { s.KubernetesServiceAccounts = []string{"b", "a"} }, "sorted"},
		"duplicate accounts":       {func(s *Service) { s.CanonicalServiceAccounts = []string{"a", "a"} }, "sorted"},
		"account with a comma":     {func(s *Service) { s.CanonicalServiceAccounts = []string{"a,b"} }, "comma"},
		"empty account":            {func(s *Service) { s.KubernetesServiceAccounts = []string{""} }, "empty"},
		"account over 512 bytes":   {func(s *Service) { s.KubernetesServiceAccounts = []string{strings.Repeat("a", 513)} }, "longer than"},
		"long value quoted, cut":   {func(s *Service) { s.Endpoints[0].Address = strings.Repeat("x", 10000) }, `…`},
		"service port of no port:": {func(s *Service) { s.Ports = nil }, "service port 80"},
	}
	for name, tc := range cases {
		s := valid()
		tc.edit(s)
		err := validateService(s, now)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error with %q", name, err, tc.want)
		}
		if err != nil && len(err.Error()) > 400 {
			t.Errorf("%s: a %d-byte error", name, len(err.Error()))
		}
	}
	twice := []*Service{valid(), valid()}
	if err := validateView(twice, now, 0); err == nil || !strings.Contains(err.Error(), "appears twice") {
		t.Errorf("a service listed twice: %v", err)
	}
	if err := validateView(syntheticView(10, 10, 1), now, 9); err == nil || !strings.Contains(err.Error(), "object cap") {
		t.Errorf("more services than the member's object cap: %v", err)
	}
	if err := validateView([]*Service{nil}, now, 0); err == nil {
		t.Error("a null service was accepted")
	}
}

// viewRejectedEvents lists the PersistedViewRejected Events on the manifest
// of id.
func viewEvents(ns, name, reason string) func(home kubernetes.Interface) ([]corev1.Event, error) {
	return func(home kubernetes.Interface) ([]corev1.Event, error) {
		list, err := home.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
			FieldSelector: "involvedObject.name=" + name + ",reason=" + reason})
		if err != nil {
			return nil, err
		}
		return list.Items, nil
	}
}

// TestRestartRefusesForgedViews: members whose API server does not answer,
// each with a persisted view: the genuine one is served as Stale; a forged
// one (no MAC, the reproduced attack), one member's genuine view copied to
// another's name, a genuine view altered under its old MAC and an
// authentic view with invalid content are refused: a Warning Event on each
// manifest, the metric by reason, and each of these members starts empty,
// as without persistence, while the genuine one is unaffected.
func TestRestartRefusesForgedViews(t *testing.T) {
	home, ns := homeNamespace(t)
	ctx := context.Background()
	m1 := env.Cluster("member1")
	const down = "https://127.0.0.1:1" // nothing listens there
	kubeconfig := []byte(strings.Replace(string(m1.Kubeconfig()), m1.Server(), down, 1))
	ids := []string{"good", "forged", "copied", "altered", "invalid"}
	data := map[string][]byte{}
	for _, id := range ids {
		data[id] = kubeconfig
	}
	if _, err := home.CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "members", data), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	key, err := ensureViewKey(ctx, home.CoreV1().Secrets(ns), ns)
	if err != nil {
		t.Fatal(err)
	}
	s := &viewStore{cms: home.CoreV1().ConfigMaps(ns), chunkSize: defaultChunkSize}
	echo := ServiceKey{Namespace: "demo", Name: "echo"}
	view := func(ip string) []*Service {
		return []*Service{{Namespace: "demo", Name: "echo", Created: time.Unix(1_700_000_000, 0).UTC(),
			Ports:     []ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}},
			Endpoints: []Endpoint{{Address: ip, Port: 8080, ServicePort: 80}}}}
	}
	persist := func(k []byte, id string, v []*Service) {
		t.Helper()
		content, sum := mustEncode(t, v)
		if _, err := s.write(ctx, k, id, content, sum, down, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	persist(key, "good", view("198.18.7.1"))
	// Forged by someone with ConfigMap rights only: no MAC (the key is
	// unknown to them; a MAC under another key fares the same).
	persist(key, "forged", view("198.18.7.2"))
	forgedData, forgedSum := mustEncode(t, view("10.66.6.7"))
	editManifest(t, home, ns, "forged", func(cm *corev1.ConfigMap) {
		cm.Data[viewKeySHA256], cm.BinaryData[viewKeyData] = forgedSum, compress(forgedData)
		delete(cm.Data, viewKeyMAC)
		delete(cm.Data, viewKeyGzSHA256)
	})
	// The genuine view of "good" under "copied"'s name.
	persist(key, "copied", view("198.18.7.3"))
	goodManifest, err := home.CoreV1().ConfigMaps(ns).Get(ctx, manifestName("good"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	editManifest(t, home, ns, "copied", func(cm *corev1.ConfigMap) { cm.Data, cm.BinaryData = goodManifest.Data, goodManifest.BinaryData })
	// A genuine view with other content under its old MAC and sums.
	persist(key, "altered", view("198.18.7.4"))
	editManifest(t, home, ns, "altered", func(cm *corev1.ConfigMap) { cm.BinaryData[viewKeyData] = compress(forgedData) })
	// Authentic, invalid content.
	persist(key, "invalid", view("127.0.0.1"))

	r, sink, _ := persistRegistry(t, ns, 2*time.Second, nil, nil)
	eventually(t, 30*time.Second, wantState(r, "good", ns+"/members", StateStale, "serving the view persisted at"))
	eventually(t, 10*time.Second, wantEndpoint(sink, "good", echo, "198.18.7.1"))
	for _, id := range ids[1:] {
		eventually(t, 30*time.Second, wantState(r, id, ns+"/members", StateTimedOut, ""))
		sink.mu.Lock()
		held := sink.services[id]
		sink.mu.Unlock()
		if len(held) != 0 {
			t.Errorf("member %s serves its refused view: %v", id, held[echo])
		}
		if st, _ := r.Cluster(id); st.Services != 0 || st.Endpoints != 0 {
			t.Errorf("member %s counts its refused view: %+v", id, st)
		}
		list := viewEvents(ns, manifestName(id), ReasonViewRejected)
		eventually(t, 30*time.Second, func() error {
			evs, err := list(home)
			if err != nil || len(evs) == 0 {
				return fmt.Errorf("no %s Event on %s (%v)", ReasonViewRejected, manifestName(id), err)
			}
			if ev := evs[0]; ev.Type != corev1.EventTypeWarning || ev.InvolvedObject.Kind != "ConfigMap" || !strings.Contains(ev.Message, "cluster "+id) {
				return fmt.Errorf("event %+v; want a Warning on the ConfigMap naming cluster %s", ev, id)
			}
			t.Logf("%s: %s", id, evs[0].Message)
			return nil
		})
	}
	if evs, err := viewEvents(ns, manifestName("good"), ReasonViewRejected)(home); err != nil || len(evs) != 0 {
		t.Errorf("the genuine view got %d rejection Events (%v)", len(evs), err)
	}
	if n := counterValue(t, r.views.rejected.WithLabelValues(rejectUnauthenticated)); n != 3 {
		t.Errorf("hub_member_view_rejected_total{reason=unauthenticated} = %v; want 3", n)
	}
	if n := counterValue(t, r.views.rejected.WithLabelValues(rejectInvalid)); n != 1 {
		t.Errorf("hub_member_view_rejected_total{reason=invalid} = %v; want 1", n)
	}
}

// TestMalformedViewKey: a key Secret that holds no usable key is reported
// (a Warning Event on it), left as it is, and no view is restored.
func TestMalformedViewKey(t *testing.T) {
	home, ns := homeNamespace(t)
	ctx := context.Background()
	m1 := env.Cluster("member1")
	const down = "https://127.0.0.1:1"
	kubeconfig := []byte(strings.Replace(string(m1.Kubeconfig()), m1.Server(), down, 1))
	if _, err := home.CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "members", map[string][]byte{"m": kubeconfig}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bad := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: ViewKeySecret}, Data: map[string][]byte{viewKeySecretData: []byte("short")}}
	if _, err := home.CoreV1().Secrets(ns).Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := &viewStore{cms: home.CoreV1().ConfigMaps(ns), chunkSize: defaultChunkSize}
	content, sum := mustEncode(t, syntheticView(2, 2, 1))
	if _, err := s.write(ctx, testViewKey, "m", content, sum, down, time.Now()); err != nil {
		t.Fatal(err)
	}
	r, sink, _ := persistRegistry(t, ns, 2*time.Second, nil, nil)
	eventually(t, 30*time.Second, wantState(r, "m", ns+"/members", StateTimedOut, ""))
	sink.mu.Lock()
	held := len(sink.services["m"])
	sink.mu.Unlock()
	if held != 0 {
		t.Errorf("a view was restored without a usable key: %d services", held)
	}
	for name, reason := range map[string]string{ViewKeySecret: ReasonViewKeyInvalid, manifestName("m"): ReasonViewRejected} {
		eventually(t, 30*time.Second, func() error {
			evs, err := viewEvents(ns, name, reason)(home)
			if err != nil || len(evs) == 0 {
				return fmt.Errorf("no %s Event on %s (%v)", reason, name, err)
			}
			if strings.Contains(evs[0].Message, "short") {
				return fmt.Errorf("the Event quotes the key: %s", evs[0].Message)
			}
			t.Logf("%s: %s", name, evs[0].Message)
			return nil
		})
	}
	if cur, err := home.CoreV1().Secrets(ns).Get(ctx, ViewKeySecret, metav1.GetOptions{}); err != nil || string(cur.Data[viewKeySecretData]) != "short" {
		t.Errorf("the malformed key Secret was changed (%v)", err)
	}
}

// counterValue reads a counter.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
