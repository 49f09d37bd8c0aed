package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/internal/localcluster"
	"github.com/hubmesh/hub/internal/xdstest"
)

// forgedIP is the address an attacker with ConfigMap rights in the hub's
// namespace (and no Secret rights) tries to slip into a member's service.
const forgedIP = "10.66.6.7"

// TestRestartRefusesForgedViews: the hub persisted the views of four
// members (one cluster registered under four IDs). While that cluster's API
// server is down and the hub is stopped, someone with ConfigMap rights only
// writes a view of their own for one member (forgedIP in the Service, no
// MAC: the attack as reproduced), copies member A's genuine view to another
// member's name, and alters a third member's genuine view under its old
// MAC. The restarted hub serves A's genuine view as Stale and refuses the
// three others: each of those members starts as without a view (TimedOut,
// nothing served), each refused manifest has a Warning Event
// PersistedViewRejected, /metrics counts them, and forgedIP appears in no
// EDS response and in no ServiceEntry the hub serves, up to a change made
// after the restart (so any refused view would have been in it).
func TestRestartRefusesForgedViews(t *testing.T) {
	t.Parallel()
	e := localcluster.Require(t, env)
	ip := dataPlaneIP(t)
	ctx := testContext(t)
	home := e.Cluster("primary")
	memberEnv, err := localcluster.Start(ctx, localcluster.Options{Names: []string{"forge-member"}, BinDir: os.Getenv("HUB_K8S_BIN_DIR")})
	if err != nil {
		t.Fatalf("starting the member cluster: %v", err)
	}
	t.Cleanup(memberEnv.Stop)
	member := memberEnv.Cluster("forge-member")

	app := "forge-" + rand.String(5)
	const port = 7070
	backend := startBackend(t, ip, "forge-1")
	if err := localcluster.EnsureNamespace(ctx, client(t, member), app); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.ApplyService(ctx, client(t, member), app, "echo", "grpc", port,
		[]localcluster.Backend{{IP: backend.addr.IP.String(), Port: int32(backend.addr.Port)}}); err != nil {
		t.Fatal(err)
	}
	ns := hubNamespace(t, home)        // the hub's own: views, their key and Events
	secretsNS := hubNamespace(t, home) // the remote Secrets, apart as in deploy/
	ids := map[string]string{"genuine": "a-genuine", "copied": "b-copied", "forged": "c-forged", "altered": "d-altered"}
	data := map[string][]byte{}
	for _, id := range ids {
		data[id] = member.Kubeconfig()
	}
	if _, err := client(t, home).CoreV1().Secrets(secretsNS).Create(ctx, localcluster.RemoteSecret(secretsNS, "members", data), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	h := startHub(t, home, "--namespace", ns, "--remote-secrets-namespace", secretsNS)
	cms := client(t, home).CoreV1().ConfigMaps(ns)
	manifests := map[string]*corev1.ConfigMap{}
	eventually(t, 60*time.Second, func() error {
		for what, id := range ids {
			cm, err := manifestOf(ctx, cms, id)
			if err != nil {
				return err
			}
			if view, err := gunzip(cm.BinaryData["view.json.gz"]); err != nil || !strings.Contains(view, fmt.Sprintf("%q", backend.addr.IP.String())) {
				return fmt.Errorf("persisted view of %s: %s (%v)", id, view, err)
			}
			manifests[what] = cm
		}
		return nil
	})
	if _, err := client(t, home).CoreV1().Secrets(ns).Get(ctx, "hub-view-key", metav1.GetOptions{}); err != nil {
		t.Fatalf("the hub did not create its view key Secret: %v", err)
	}

	member.StopAPIServer()
	h.stop(t)

	// B: A's genuine manifest (MAC included) under B's name.
	a := manifests["genuine"]
	tamper(t, cms, manifests["copied"], func(cm *corev1.ConfigMap) { cm.Data, cm.BinaryData = a.Data, a.BinaryData })
	// C: written from scratch by the attacker, as a hub before MACs wrote views.
	forged := fmt.Sprintf(`{"v":1,"s":[{"ns":%q,"n":"echo","p":[{"n":"grpc","p":%d,"t":"TCP"}],"e":[{"a":%q,"p":8080,"s":%d}]}]}`, app, port, forgedIP, port)
	tamper(t, cms, manifests["forged"], func(cm *corev1.ConfigMap) {
		sum := sha256.Sum256([]byte(forged))
		cm.Data = map[string]string{"sha256": hex.EncodeToString(sum[:]), "writtenAt": time.Now().UTC().Format(time.RFC3339Nano),
			"bytes": fmt.Sprint(len(forged)), "chunks": "0", "server": cm.Data["server"]}
		cm.BinaryData = map[string][]byte{"view.json.gz": gzipBytes(t, forged)}
	})
	// D: its genuine view with forgedIP in place of the backend, SHA-256
	// updated, the old MAC kept.
	tamper(t, cms, manifests["altered"], func(cm *corev1.ConfigMap) {
		view, err := gunzip(cm.BinaryData["view.json.gz"])
		if err != nil {
			t.Fatal(err)
		}
		view = strings.ReplaceAll(view, fmt.Sprintf("%q", backend.addr.IP.String()), fmt.Sprintf("%q", forgedIP))
		sum := sha256.Sum256([]byte(view))
		cm.Data["sha256"] = hex.EncodeToString(sum[:])
		cm.BinaryData["view.json.gz"] = gzipBytes(t, view)
	})

	restarted := time.Now()
	h2 := startHub(t, home, "--namespace", ns, "--remote-secrets-namespace", secretsNS)
	t.Logf("restarted hub ready %s after the restart", time.Since(restarted).Round(100*time.Millisecond))
	host := fmt.Sprintf("echo.%s.svc.cluster.local", app)
	eds := fmt.Sprintf("outbound|%d||%s", port, host)
	edsLog := watchADS(t, h2.xdsAddr, sidecarNode(home.Name), resourcev3.EndpointType, eds)
	seLog := watchADS(t, h2.xdsAddr, istiodNode(), "networking.istio.io/v1/ServiceEntry")

	c := h2.clusterState(t, 35*time.Second, ids["genuine"], "Stale")
	if !strings.Contains(c.Message, "serving the view persisted at") || c.Endpoints != 1 {
		t.Errorf("the member with a genuine view is %+v; want Stale from its persisted view with 1 endpoint", c)
	}
	for _, what := range []string{"copied", "forged", "altered"} {
		c := h2.clusterState(t, 60*time.Second, ids[what], "TimedOut")
		if c.Services != 0 || c.Endpoints != 0 || strings.Contains(c.Message, "persisted") {
			t.Errorf("member %s (%s view) is %+v; want it empty, as without a view", ids[what], what, c)
		}
		name := manifests[what].Name
		eventually(t, 30*time.Second, func() error {
			list, err := client(t, home).CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=PersistedViewRejected"})
			if err != nil || len(list.Items) == 0 {
				return fmt.Errorf("no PersistedViewRejected Event on %s (%v)", name, err)
			}
			if ev := list.Items[0]; ev.Type != corev1.EventTypeWarning || ev.InvolvedObject.Kind != "ConfigMap" {
				return fmt.Errorf("event %+v; want a Warning on the ConfigMap", ev)
			}
			t.Logf("%s view: Event %q", what, list.Items[0].Message)
			return nil
		})
	}

	// A change after every member was restored or refused: the home cluster
	// (a member too) gets the same Service with a marker endpoint. Every
	// response up to the one carrying the marker holds the whole served
	// state, so a refused view that slipped through would be in one.
	marker := "198.18.66.1"
	if err := localcluster.EnsureNamespace(ctx, client(t, home), app); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.ApplyService(ctx, client(t, home), app, "echo", "grpc", port, []localcluster.Backend{{IP: marker, Port: 8080}}); err != nil {
		t.Fatal(err)
	}
	for name, l := range map[string]*adsLog{"EDS": edsLog, "ServiceEntry": seLog} {
		l.waitFor(t, 60*time.Second, marker)
		if n := l.count(forgedIP); n != 0 {
			t.Errorf("%d %s responses of the restarted hub hold %s", n, name, forgedIP)
		}
		if l.count(backend.addr.IP.String()) == 0 {
			t.Errorf("no %s response holds the genuine view's backend %s", name, backend.addr.IP)
		}
	}
	if got := metric(t, h2, `hub_member_view_rejected_total{reason="unauthenticated"}`); got != "3" {
		t.Errorf("hub_member_view_rejected_total{reason=\"unauthenticated\"} = %q; want 3", got)
	}
	if log, _ := os.ReadFile(h2.logPath); !bytes.Contains(log, []byte("refusing the persisted view of a member")) {
		t.Error("the hub's log does not mention the refused views")
	}

	// The member's API server returns: every member is Ready, and the
	// refused views are replaced by authentic live ones.
	if err := member.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := member.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	for what, id := range ids {
		h2.clusterState(t, 60*time.Second, id, "Ready")
		eventually(t, 60*time.Second, func() error {
			cm, err := manifestOf(ctx, cms, id)
			if err != nil {
				return err
			}
			view, err := gunzip(cm.BinaryData["view.json.gz"])
			if err != nil {
				return err
			}
			if cm.Data["hmacSHA256"] == "" || strings.Contains(view, forgedIP) || !strings.Contains(view, fmt.Sprintf("%q", backend.addr.IP.String())) {
				return fmt.Errorf("the %s view of %s is not rewritten from the live member yet: %v %s", what, id, cm.Data, view)
			}
			return nil
		})
	}

	// The view key never leaves its Secret: not in the log, /metrics, the
	// API or the dashboard.
	keySecret, err := client(t, home).CoreV1().Secrets(ns).Get(ctx, clusters.ViewKeySecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	key := keySecret.Data["key"]
	logData, _ := os.ReadFile(h2.logPath)
	where := dashboardPages(t, h2.adminURL, home.AdminToken(), "/", "/clusters")
	where["hub log"] = string(logData)
	where["/metrics"] = h2.scrapeMetrics(t)
	var list json.RawMessage
	h2.getJSON(t, "/api/v1/clusters", &list)
	where["GET /api/v1/clusters"] = string(list)
	for name, text := range where {
		for _, form := range []string{string(key), base64.StdEncoding.EncodeToString(key), hex.EncodeToString(key)} {
			if len(key) == 0 || strings.Contains(text, form) {
				t.Errorf("%s contains the view key (or the key is empty)", name)
			}
		}
	}
}

// manifestOf is the manifest of member id's persisted view.
func manifestOf(ctx context.Context, cms typedcorev1.ConfigMapInterface, id string) (*corev1.ConfigMap, error) {
	list, err := cms.List(ctx, metav1.ListOptions{LabelSelector: "hub.federation/cluster=" + id + ",hub.federation/member-view-role=manifest"})
	if err != nil || len(list.Items) != 1 {
		return nil, fmt.Errorf("persisted view manifests of %s: %d (%v)", id, len(list.Items), err)
	}
	return &list.Items[0], nil
}

// tamper rewrites a ConfigMap as someone with ConfigMap rights can.
func tamper(t *testing.T, cms typedcorev1.ConfigMapInterface, orig *corev1.ConfigMap, edit func(*corev1.ConfigMap)) {
	t.Helper()
	cm, err := cms.Get(context.Background(), orig.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	edit(cm)
	if _, err := cms.Update(context.Background(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func gzipBytes(t *testing.T, s string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func sidecarNode(cluster string) *corev3.Node {
	node := &corev3.Node{Id: "sidecar~198.18.0.9~forge-" + rand.String(6) + ".forge~forge.svc.cluster.local"}
	node.Metadata, _ = structpb.NewStruct(map[string]any{"CLUSTER_ID": cluster})
	return node
}

// istiodNode is a member istiod as it opens its MCP stream (docs/architecture.md §3.7).
func istiodNode() *corev3.Node {
	meta, _ := structpb.NewStruct(map[string]any{"GENERATOR": "api", "ISTIO_VERSION": "1.31.1"})
	return &corev3.Node{Id: "~~istiod-0.istio-system~istio-system.svc.cluster.local", Metadata: meta}
}

// adsLog keeps the raw resources of every response on one ADS stream.
type adsLog struct {
	mu        sync.Mutex
	responses [][]byte // each response's resources, concatenated
	changed   chan struct{}
	err       error // of the last stream that ended
}

// watchADS keeps one ADS stream open for one type (names empty: wildcard),
// reconnecting as a client does while the hub refuses streams, ACKs every
// response and logs it, until the test ends.
func watchADS(t *testing.T, addr string, node *corev3.Node, typeURL string, names ...string) *adsLog {
	t.Helper()
	l := &adsLog{changed: make(chan struct{}, 1)}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-done
		conn.Close()
	})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			err := l.stream(ctx, conn, node, typeURL, names)
			l.mu.Lock()
			l.err = err
			l.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond): // client backoff
			}
		}
	}()
	return l
}

func (l *adsLog) stream(ctx context.Context, conn *grpc.ClientConn, node *corev3.Node, typeURL string, names []string) error {
	first := &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNames: names}
	return xdstest.Session(ctx, conn, []*discoveryv3.DiscoveryRequest{first}, func(resp *discoveryv3.DiscoveryResponse) *discoveryv3.DiscoveryRequest {
		var all []byte
		for _, r := range resp.Resources {
			all = append(all, r.Value...)
		}
		l.mu.Lock()
		l.responses = append(l.responses, all)
		l.mu.Unlock()
		select {
		case l.changed <- struct{}{}:
		default:
		}
		return xdstest.ACK(resp, names...)
	})
}

// count is the number of responses that hold s.
func (l *adsLog) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.responses {
		if bytes.Contains(r, []byte(s)) {
			n++
		}
	}
	return n
}

// waitFor waits until a response holds s.
func (l *adsLog) waitFor(t *testing.T, timeout time.Duration, s string) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for l.count(s) == 0 {
		select {
		case <-l.changed:
		case <-deadline.C:
			l.mu.Lock()
			defer l.mu.Unlock()
			t.Fatalf("no response held %s within %s (%d responses; last stream error: %v)", s, timeout, len(l.responses), l.err)
		}
	}
}
