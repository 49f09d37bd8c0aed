package clusters

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/hubmesh/hub/internal/localcluster"
)

// BenchmarkPersistView measures what persisting member views costs at
// 1,000 services / 20,000 endpoints, held by one member or spread over ten:
// each op churns 1% of every member's endpoints, encodes each view and
// writes it (gzip, chunks of 700 KiB) to a real home API server. Under
// continuous churn each member is written at most once per
// viewWriteInterval (30 s), which gives the writes and bytes per minute.
//
//	go test -run '^$' -bench PersistView -benchtime 20x ./clusters/
func BenchmarkPersistView(b *testing.B) {
	for _, members := range []int{1, 10} {
		b.Run(fmt.Sprintf("members=%d/services=1000/endpoints=20000", members), func(b *testing.B) {
			benchmarkPersistView(b, members, 1000, 20000)
		})
	}
}

func benchmarkPersistView(b *testing.B, members, services, endpoints int) {
	e := localcluster.Require(b, env)
	ctx := context.Background()
	home := kube(b, e.Cluster("home"))
	ns := "hub-" + rand.String(6)
	if err := localcluster.EnsureNamespace(ctx, home, ns); err != nil {
		b.Fatal(err)
	}
	store := &viewStore{cms: home.CoreV1().ConfigMaps(ns), chunkSize: defaultChunkSize}
	views := make([][]*Service, members)
	for m := range members {
		views[m] = syntheticView(services/members, endpoints/members, uint64(m))
	}
	rng := mrand.New(mrand.NewPCG(1, 2))
	var raw, gz, objects, writes int
	var encoding time.Duration
	b.ResetTimer()
	for range b.N {
		for m := range members {
			churn(views[m], rng, endpoints/members/100)
			start := time.Now()
			data, sum, err := encodeView(views[m])
			if err != nil {
				b.Fatal(err)
			}
			encoding += time.Since(start)
			res, err := store.write(ctx, testViewKey, fmt.Sprintf("member-%d", m), data, sum, "https://member.example", time.Now())
			if err != nil {
				b.Fatal(err)
			}
			if res.Skipped {
				b.Fatal("churned view was not written")
			}
			raw, gz, objects, writes = raw+res.Bytes, gz+res.Compressed, objects+res.Objects, writes+1
		}
	}
	b.StopTimer()
	perMinute := float64(members) * float64(time.Minute) / float64(viewWriteInterval)
	b.ReportMetric(float64(raw)/float64(writes), "json-B/write")
	b.ReportMetric(float64(gz)/float64(writes), "gzip-B/write")
	b.ReportMetric(float64(objects)/float64(writes), "objects/write")
	b.ReportMetric(float64(encoding.Milliseconds())/float64(writes), "encode-ms/write")
	b.ReportMetric(perMinute, "writes/min")
	b.ReportMetric(perMinute*float64(gz)/float64(writes)/1024, "gzip-KiB/min")
}

// churn gives n endpoints of a view new addresses, replacing the services
// it touches (values handed to a Sink are never modified).
func churn(view []*Service, rng *mrand.Rand, n int) {
	for range max(n, 1) {
		i := rng.IntN(len(view))
		s := *view[i]
		if len(s.Endpoints) == 0 {
			continue
		}
		s.Endpoints = append([]Endpoint(nil), s.Endpoints...)
		j := rng.IntN(len(s.Endpoints))
		s.Endpoints[j].Address = fmt.Sprintf("10.%d.%d.%d", 16+rng.IntN(16), rng.IntN(256), 1+rng.IntN(254))
		view[i] = &s
	}
}
