package main

import (
	"context"
	"log/slog"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/internal/localcluster"
)

// demoChurnEvery is how often the churn scales its service.
const demoChurnEvery = 5 * time.Second

// runChurn scales a service of one member between its first backend and
// all of backends every demoChurnEvery until ctx is done, so that the hub
// has something to push (the dashboard's push chart and latency move, and
// the clients' split across members shifts with the member's locality
// weight). A member whose API server does not answer is simply tried again
// at the next tick.
func runChurn(ctx context.Context, c kubernetes.Interface, member, namespace, service, portName string, backends []localcluster.Backend, log *slog.Logger) {
	tick := time.NewTicker(demoChurnEvery)
	defer tick.Stop()
	up := true // seeded with every backend
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		up = !up
		want := backends[:1]
		if up {
			want = backends
		}
		wctx, cancel := context.WithTimeout(ctx, demoChurnEvery)
		err := localcluster.ApplyEndpoints(wctx, c, namespace, service, portName, want)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("demo churn: scaling failed", "cluster", member, "service", namespace+"/"+service, "error", err)
			}
			up = !up // try the same step again
			continue
		}
		log.Info("demo churn: scaled", "cluster", member, "service", namespace+"/"+service, "endpoints", len(want))
	}
}
