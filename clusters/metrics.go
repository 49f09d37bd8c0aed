package clusters

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	allStates = []State{StatePending, StateSyncing, StateReady, StateStale, StateUnreachable, StateTimedOut, StateInvalid, StateConflict}

	descState = prometheus.NewDesc("hub_cluster_state",
		"1 for the member's current state, 0 for the other states.", []string{"cluster", "secret", "state"}, nil)
	descObjects = prometheus.NewDesc("hub_cluster_informer_objects",
		"Objects held by a member's informers, by kind.", []string{"cluster", "kind"}, nil)
	descServices = prometheus.NewDesc("hub_cluster_services",
		"Services federated from a member.", []string{"cluster"}, nil)
	descEndpoints = prometheus.NewDesc("hub_cluster_endpoints",
		"Endpoints (address, service port) federated from a member.", []string{"cluster"}, nil)
	descSyncDuration = prometheus.NewDesc("hub_cluster_sync_duration_seconds",
		"How long the first full sync of the member's current client took.", []string{"cluster"}, nil)
	descLastSync = prometheus.NewDesc("hub_cluster_last_sync_timestamp_seconds",
		"When the member's view last changed or was fully synced.", []string{"cluster"}, nil)
	descWithheld = prometheus.NewDesc("hub_cluster_cross_network_withheld_endpoints",
		"Endpoints of a member that clients on other networks do not get, by client: all (no gateway, or not Istio mTLS) or proxyless (also when no gateway of its network admits proxyless gRPC: annotation hub.federation/proxyless-alpn).", []string{"cluster", "clients"}, nil)
	descGatewaysRefused = prometheus.NewDesc("hub_cluster_gateways_refused",
		"East-west gateways (or gateway Services) of a member the hub refuses now: outside the gateway namespaces, another network, no address, over the cap, ...; the reasons are in GET /api/v1/clusters/{id}.", []string{"cluster"}, nil)
)

// registryCollector reports membership metrics computed at scrape time from
// the registry itself, so they can never disagree with the API.
type registryCollector struct{ r *Registry }

func (c registryCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descState, descObjects, descServices, descEndpoints, descSyncDuration, descLastSync, descGatewaysRefused, descWithheld} {
		ch <- d
	}
}

func (c registryCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.r.Clusters() {
		for _, s := range allStates {
			v := 0.0
			if s == st.State {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, v, st.ID, st.Secret, string(s))
		}
	}
	for _, cl := range c.r.activeClusters() {
		st := cl.status()
		for kind, n := range cl.objectCounts() {
			ch <- prometheus.MustNewConstMetric(descObjects, prometheus.GaugeValue, float64(n), cl.id, kind)
		}
		ch <- prometheus.MustNewConstMetric(descServices, prometheus.GaugeValue, float64(st.Services), cl.id)
		ch <- prometheus.MustNewConstMetric(descEndpoints, prometheus.GaugeValue, float64(st.Endpoints), cl.id)
		ch <- prometheus.MustNewConstMetric(descGatewaysRefused, prometheus.GaugeValue, float64(st.GatewaysRefusedCount), cl.id)
		ch <- prometheus.MustNewConstMetric(descWithheld, prometheus.GaugeValue, float64(st.CrossNetworkWithheld), cl.id, "all")
		ch <- prometheus.MustNewConstMetric(descWithheld, prometheus.GaugeValue, float64(st.ProxylessWithheld), cl.id, "proxyless")
		if !st.LastSyncTime.IsZero() {
			ch <- prometheus.MustNewConstMetric(descSyncDuration, prometheus.GaugeValue, st.SyncDuration.Seconds(), cl.id)
			ch <- prometheus.MustNewConstMetric(descLastSync, prometheus.GaugeValue, float64(st.LastSyncTime.Unix()), cl.id)
		}
	}
}
