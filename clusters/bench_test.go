package clusters

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/internal/localcluster"
)

// BenchmarkMemberSync measures one member with 5,000 Services and 50,000
// endpoints (10 per EndpointSlice) on a real API server: the time from
// registering it to Ready, and the heap and RSS the hub holds for it
// (informer caches plus the service views handed to the sink).
//
//	go test -run '^$' -bench MemberSync -benchtime 1x ./clusters/
func BenchmarkMemberSync(b *testing.B) {
	const services, perService = 5000, 10
	e := localcluster.Require(b, env)
	ctx := context.Background()
	member := e.Cluster("member2")
	cfg := member.RESTConfig()
	cfg.QPS, cfg.Burst = -1, 0 // seed as fast as the API server allows
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	seedStart := time.Now()
	seedMany(b, cs, services, perService)
	b.Logf("seeded %d services / %d endpoints in %s", services, services*perService, time.Since(seedStart).Round(time.Second))

	for range b.N {
		heapBefore, rssBefore := memNow()
		ns := "hub-" + rand.String(6)
		if err := localcluster.EnsureNamespace(ctx, kube(b, e.Cluster("home")), ns); err != nil {
			b.Fatal(err)
		}
		sink := newRecordingSink()
		r, err := NewRegistry(Config{Home: e.Cluster("home").RESTConfig(), HomeID: "home", Namespace: ns, SyncTimeout: 5 * time.Minute, Sink: sink})
		if err != nil {
			b.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error)
		go func() { done <- r.Run(runCtx) }()
		start := time.Now()
		if _, err := kube(b, e.Cluster("home")).CoreV1().Secrets(ns).Create(ctx, localcluster.RemoteSecret(ns, "big", map[string][]byte{"big": member.Kubeconfig()}), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		for {
			if st, ok := r.Cluster("big"); ok && st.State == StateReady {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		took := time.Since(start)
		st, _ := r.Cluster("big")
		heapAfter, rssAfter := memNow()
		perEndpoint := float64(heapAfter-heapBefore) / float64(st.Endpoints)
		b.ReportMetric(took.Seconds(), "sync-s")
		b.ReportMetric(perEndpoint, "heap-B/endpoint")
		b.ReportMetric(float64(heapAfter-heapBefore)/(1<<20), "heap-MiB")
		b.ReportMetric(float64(rssAfter-rssBefore)/(1<<20), "rss-MiB")
		b.Logf("member with %d services, %d endpoints: Ready in %s; heap +%.1f MiB (%.0f B/endpoint), RSS +%.1f MiB",
			st.Services, st.Endpoints, took.Round(time.Millisecond), float64(heapAfter-heapBefore)/(1<<20), perEndpoint, float64(rssAfter-rssBefore)/(1<<20))
		cancel()
		<-done
	}
}

// seedMany creates services×perService endpoints in 10 namespaces, once.
func seedMany(b *testing.B, cs kubernetes.Interface, services, perService int) {
	ctx := context.Background()
	var wg sync.WaitGroup
	work := make(chan int)
	errs := make(chan error, 1)
	for range 16 {
		wg.Go(func() {
			for i := range work {
				ns := fmt.Sprintf("bench-%d", i%10)
				backends := make([]localcluster.Backend, perService)
				for j := range backends {
					backends[j] = localcluster.Backend{IP: fmt.Sprintf("10.%d.%d.%d", i/250, i%250, j+1), Port: 8080}
				}
				if err := localcluster.ApplyService(ctx, cs, ns, "svc-"+strconv.Itoa(i), "http", 80, backends); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	for i := range 10 {
		if err := localcluster.EnsureNamespace(ctx, cs, fmt.Sprintf("bench-%d", i)); err != nil {
			b.Fatal(err)
		}
	}
	for i := range services {
		work <- i
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
}

// memNow returns the live heap after a full GC and the process RSS, in bytes.
func memNow() (heap, rss uint64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	data, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			rss = kb << 10
		}
	}
	return ms.HeapAlloc, rss
}
