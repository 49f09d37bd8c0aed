package xdsgen

import (
	"math"
	"sort"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/hubmesh/hub/distribute"
	"github.com/hubmesh/hub/hub/feed"
)

// Locality is where a client is, for locality load balancing: its node's
// region and zone (as far as some endpoint shares them, see
// feed.Index.KnownLocality) and its member. The hub's localities carry the
// member ID as their sub-zone (see buildLoadAssignment), so the client's
// sub-zone is its member: Istio's "same region, zone and sub-zone" is
// "same member" here.
type Locality struct {
	Region, Zone, Member string
}

// DestinationRuleKind is the kind (as distribute.Source names it) whose
// objects the hub's own xDS takes load balancing from.
const DestinationRuleKind = "networking.istio.io/v1/DestinationRule"

// destinationRules are the DestinationRules the hub's own xDS honours, by
// the host they name: those in the namespaces distribution is allowed
// from (distribute.Source.Rules), naming a host the hub serves in full
// (<name>.<namespace>.svc.<domain suffix>, or a short name in the rule's
// namespace) or by a wildcard ("*.<namespace>.svc.cluster.local"). An
// exact host wins over a wildcard, a longer wildcard over a shorter, then
// the oldest rule (as istiod prefers). Rules with a workloadSelector apply
// to the selected workloads' sidecars only and are not read.
type destinationRules struct {
	exact     map[string]ruleOf
	wildcards []ruleOf // most specific first
	// regions ("region") and zones ("region/zone") the rules' failover
	// and distribute entries name as where clients come from: a client
	// there keeps its locality even when no endpoint is there.
	from map[string]bool
}

// ruleOf is one DestinationRule and the host it names, expanded.
type ruleOf struct {
	host    string
	id      string // namespace/name@version: what changes when the rule does
	spec    *networking.DestinationRule
	created int64
}

func newDestinationRules(objs []distribute.Object, domainSuffix string) *destinationRules {
	r := &destinationRules{exact: map[string]ruleOf{}, from: map[string]bool{}}
	older := func(a, b ruleOf) bool {
		if a.created != b.created {
			return a.created < b.created
		}
		return a.id < b.id
	}
	for _, o := range objs {
		dr, ok := o.Spec.(*networking.DestinationRule)
		if !ok || dr.GetHost() == "" || dr.GetWorkloadSelector() != nil {
			continue
		}
		host := strings.ToLower(strings.TrimSuffix(dr.GetHost(), "."))
		if !strings.Contains(host, ".") && host != "*" {
			host = host + "." + o.Namespace + ".svc." + domainSuffix
		}
		rule := ruleOf{host: host, id: o.Namespace + "/" + o.Name + "@" + o.Version, spec: dr, created: o.CreationTimestamp.UnixNano()}
		r.noteFrom(dr.GetTrafficPolicy().GetLoadBalancer().GetLocalityLbSetting())
		for _, pl := range dr.GetTrafficPolicy().GetPortLevelSettings() {
			r.noteFrom(pl.GetLoadBalancer().GetLocalityLbSetting())
		}
		if strings.HasPrefix(host, "*") {
			r.wildcards = append(r.wildcards, rule)
			continue
		}
		if cur, ok := r.exact[host]; !ok || older(rule, cur) {
			r.exact[host] = rule
		}
	}
	sort.Slice(r.wildcards, func(i, j int) bool {
		a, b := r.wildcards[i], r.wildcards[j]
		if len(a.host) != len(b.host) {
			return len(a.host) > len(b.host)
		}
		return older(a, b)
	})
	return r
}

// noteFrom records the regions and zones a setting's entries name as
// where clients come from.
func (r *destinationRules) noteFrom(s *networking.LocalityLoadBalancerSetting) {
	for _, f := range s.GetFailover() {
		r.from[f.GetFrom()] = true
	}
	for _, d := range s.GetDistribute() {
		parts := strings.Split(d.GetFrom(), "/")
		if parts[0] != "*" {
			r.from[parts[0]] = true
			if len(parts) > 1 && parts[1] != "*" && parts[1] != "" {
				r.from[parts[0]+"/"+parts[1]] = true
			}
		}
	}
}

// knownLocality is places.KnownLocality, keeping also the regions and
// zones the rules name as where clients come from.
func (r *destinationRules) knownLocality(places Places, region, zone string) (string, string) {
	kr, kz := places.KnownLocality(region, zone)
	if r == nil {
		return kr, kz
	}
	if kr != region && r.from[region] {
		kr, kz = region, feed.UnknownLocality
	}
	if kr == region && kz != zone && r.from[region+"/"+zone] {
		kz = zone
	}
	return kr, kz
}

// Refused is a DestinationRule whose load balancing the hub's xDS does not
// apply, and why.
type Refused struct {
	Rule, Reason string // Rule: namespace/name
}

// refusedRules lists the rules with values Istio's validation refuses
// (see localityLBOf): the hub applies none of their load balancing to the
// ports they concern.
func refusedRules(objs []distribute.Object) []Refused {
	var out []Refused
	for _, o := range objs {
		dr, ok := o.Spec.(*networking.DestinationRule)
		if !ok {
			continue
		}
		policies := []*networking.TrafficPolicy{dr.GetTrafficPolicy()}
		for _, pl := range dr.GetTrafficPolicy().GetPortLevelSettings() {
			policies = append(policies, &networking.TrafficPolicy{LoadBalancer: pl.GetLoadBalancer(), OutlierDetection: pl.GetOutlierDetection()})
		}
		for _, tp := range policies {
			var why string
			switch {
			case !validOutlier(tp.GetOutlierDetection()):
				why = "outlierDetection: durations must be at least 1ms and percentages 0-100"
			case !validDistribute(tp.GetLoadBalancer().GetLocalityLbSetting().GetDistribute()):
				why = "localityLbSetting.distribute: every entry needs a from, and to weights of 1-100 summing to 100"
			}
			if why != "" {
				out = append(out, Refused{Rule: o.Namespace + "/" + o.Name, Reason: why})
				break
			}
		}
	}
	return out
}

// lookup returns the rule that applies to a host, if any.
func (r *destinationRules) lookup(host string) (ruleOf, bool) {
	if r == nil {
		return ruleOf{}, false
	}
	if rule, ok := r.exact[host]; ok {
		return rule, true
	}
	for _, w := range r.wildcards {
		if suffix := strings.TrimPrefix(w.host, "*"); strings.HasSuffix(host, suffix) {
			return w, true
		}
	}
	return ruleOf{}, false
}

func (r *destinationRules) empty() bool {
	return r == nil || len(r.exact) == 0 && len(r.wildcards) == 0
}

// localityLB is what a DestinationRule says of one port's locality load
// balancing, as istiod reads it (loadbalancer.GetEffectiveLbSetting,
// ApplyToCluster): the rule's localityLbSetting, else the mesh's default
// (Istio's default mesh config: enabled, nothing else set); failover, that
// the rule has outlier detection (priorities only then: without it a
// client would never leave priority 0). The first portLevelSettings entry
// of the port replaces the rule-wide policy whole (Istio's port-level
// policies do not inherit: what they leave out is the default). A rule
// whose values Istio would refuse (validOutlier, validDistribute) counts
// as absent.
type localityLB struct {
	setting *networking.LocalityLoadBalancerSetting // nil: off
	outlier *networking.OutlierDetection            // nil: none (no failover)
}

func localityLBOf(dr *networking.DestinationRule, port int32) localityLB {
	tp := dr.GetTrafficPolicy()
	lb, outlier := tp.GetLoadBalancer(), tp.GetOutlierDetection()
	if pl := portLevel(dr, port); pl != nil {
		lb, outlier = pl.GetLoadBalancer(), pl.GetOutlierDetection()
	}
	if !validOutlier(outlier) {
		return localityLB{}
	}
	setting := lb.GetLocalityLbSetting()
	if !validDistribute(setting.GetDistribute()) {
		return localityLB{}
	}
	switch {
	case setting == nil:
		setting = &networking.LocalityLoadBalancerSetting{} // the mesh default: enabled
	case setting.GetEnabled() != nil && !setting.GetEnabled().GetValue():
		setting = nil
	}
	return localityLB{setting: setting, outlier: outlier}
}

// validOutlier reports whether outlier detection has the values Istio's
// validation accepts (durations of at least 1 ms, percentages 0–100):
// Envoy and grpc-go refuse a Cluster with others.
func validOutlier(o *networking.OutlierDetection) bool {
	if o == nil {
		return true
	}
	for _, d := range []*durationpb.Duration{o.GetInterval(), o.GetBaseEjectionTime()} {
		if d != nil && (d.CheckValid() != nil || d.AsDuration() < time.Millisecond) {
			return false
		}
	}
	return o.GetMaxEjectionPercent() >= 0 && o.GetMaxEjectionPercent() <= 100 &&
		o.GetMinHealthPercent() >= 0 && o.GetMinHealthPercent() <= 100
}

// validDistribute reports whether distribute entries are as Istio's
// validation accepts them: each with a from, and to weights of 1–100
// summing to 100.
func validDistribute(ds []*networking.LocalityLoadBalancerSetting_Distribute) bool {
	for _, d := range ds {
		if d.GetFrom() == "" {
			return false
		}
		var sum uint32
		for _, w := range d.GetTo() {
			if w == 0 || w > 100 {
				return false
			}
			sum += w
		}
		if sum != 100 {
			return false
		}
	}
	return true
}

// applies reports whether the client's locality changes anything: weights
// to distribute, or failover priorities.
func (l localityLB) applies() bool {
	return l.setting != nil && (len(l.setting.GetDistribute()) > 0 || l.outlier != nil)
}

// weighted reports whether a Cluster needs locality-weighted load
// balancing (Envoy ignores locality weights without it), as istiod sets it.
func (l localityLB) weighted() bool {
	s := l.setting
	return s != nil && (len(s.GetDistribute()) > 0 || l.outlier != nil && (len(s.GetFailover()) > 0 || len(s.GetFailoverPriority()) > 0))
}

// applyToCluster sets what the rule asks of a Cluster, as istiod does:
// locality-weighted load balancing, and the outlier detection
// (applyOutlierDetection: success-rate ejection off, consecutive errors
// enforced, the panic threshold at minHealthPercent).
func (l localityLB) applyToCluster(c *clusterv3.Cluster) {
	if l.weighted() {
		if c.CommonLbConfig == nil {
			c.CommonLbConfig = &clusterv3.Cluster_CommonLbConfig{}
		}
		c.CommonLbConfig.LocalityConfigSpecifier = &clusterv3.Cluster_CommonLbConfig_LocalityWeightedLbConfig_{
			LocalityWeightedLbConfig: &clusterv3.Cluster_CommonLbConfig_LocalityWeightedLbConfig{},
		}
	}
	o := l.outlier
	if o == nil {
		return
	}
	out := &clusterv3.OutlierDetection{EnforcingSuccessRate: wrapperspb.UInt32(0)}
	enforce := func(v uint32) *wrapperspb.UInt32Value {
		if v > 0 {
			v = 100
		}
		return wrapperspb.UInt32(v)
	}
	if e := o.GetConsecutive_5XxErrors(); e != nil {
		out.Consecutive_5Xx, out.EnforcingConsecutive_5Xx = wrapperspb.UInt32(e.GetValue()), enforce(e.GetValue())
	}
	if e := o.GetConsecutiveGatewayErrors(); e != nil {
		out.ConsecutiveGatewayFailure, out.EnforcingConsecutiveGatewayFailure = wrapperspb.UInt32(e.GetValue()), enforce(e.GetValue())
	}
	out.Interval, out.BaseEjectionTime = o.GetInterval(), o.GetBaseEjectionTime()
	if p := o.GetMaxEjectionPercent(); p > 0 {
		out.MaxEjectionPercent = wrapperspb.UInt32(uint32(min(p, 100)))
	}
	if o.GetSplitExternalLocalOriginErrors() {
		out.SplitExternalLocalOriginErrors = true
		out.EnforcingLocalOriginSuccessRate = wrapperspb.UInt32(0)
		if n := o.GetConsecutiveLocalOriginFailures(); n != nil {
			out.ConsecutiveLocalOriginFailure, out.EnforcingConsecutiveLocalOriginFailure = wrapperspb.UInt32(n.GetValue()), enforce(n.GetValue())
		}
	}
	c.OutlierDetection = out
	if c.CommonLbConfig == nil {
		c.CommonLbConfig = &clusterv3.Cluster_CommonLbConfig{}
	}
	c.CommonLbConfig.HealthyPanicThreshold = &typev3.Percent{Value: float64(max(o.GetMinHealthPercent(), 0))}
}

// Topology labels istiod gives every proxy and endpoint, and the only
// labels the hub knows of both: failoverPriority compares these; any other
// label it names is skipped (the hub does not know the endpoints' pod
// labels).
const (
	labelNetwork = "topology.istio.io/network"
	labelCluster = "topology.istio.io/cluster"
	labelRegion  = "topology.kubernetes.io/region"
	labelZone    = "topology.kubernetes.io/zone"
	labelSubzone = "topology.istio.io/subzone"
)

// placed is one locality of an assignment: its member, network, region
// and zone, as buildLoadAssignment grouped its endpoints.
type placed struct {
	member, network, region, zone string
}

// topologyLabel is a locality's or client's value of a topology label,
// and whether the hub knows the label.
func (p placed) topologyLabel(label string) (string, bool) {
	switch label {
	case labelNetwork:
		return p.network, true
	case labelCluster:
		return p.member, true
	case labelRegion:
		return p.region, true
	case labelZone:
		return p.zone, true
	case labelSubzone:
		return p.member, true // the hub's sub-zone is the member
	}
	return "", false
}

// rankLocalities returns each locality's priority for a client, as
// istiod's ApplyLocalityLoadBalancer ranks them (before the demotion of
// unhealthy members), and, when the rule distributes, each one's weight (0:
// left out); weights is nil when it does not.
func rankLocalities(locs []placed, baseWeights []uint32, client Locality, network string, l localityLB) (prio []uint32, weights []uint32) {
	prio = make([]uint32, len(locs))
	if !l.applies() {
		return prio, nil
	}
	s := l.setting
	if len(s.GetDistribute()) > 0 {
		return prio, distributeWeights(locs, baseWeights, client, s.GetDistribute())
	}
	if len(s.GetFailoverPriority()) > 0 {
		me := placed{member: client.Member, network: network, region: client.Region, zone: client.Zone}
		failoverPriorities(locs, me, s.GetFailoverPriority(), prio)
		if len(s.GetFailover()) == 0 {
			return prio, nil
		}
	}
	localityFailover(locs, client, s.GetFailover(), prio)
	return prio, nil
}

// failoverPriorities is istiod's applyFailoverPriorities over the hub's
// localities (every endpoint of one has the same topology labels, so none
// is split): the first label the locality does not share with the client
// ranks it; a network mismatch listed first only moves it behind all
// matching ones. A label given as "label=value" compares value.
func failoverPriorities(locs []placed, me placed, labels []string, prio []uint32) {
	n := len(labels)
	includesNetwork := n > 0 && labels[0] == labelNetwork
	for i, loc := range locs {
		priority, adjust := 0, 0
		for j, lv := range labels {
			label, override, hasOverride := strings.Cut(lv, "=")
			want, known := me.topologyLabel(label)
			if hasOverride {
				want = override
			}
			got, _ := loc.topologyLabel(label)
			if !known || want == got {
				continue
			}
			if j == 0 && includesNetwork {
				adjust = n
				continue
			}
			priority = n - j
			break
		}
		prio[i] = uint32(priority + adjust)
	}
	compact(prio)
}

// localityFailover is istiod's applyLocalityFailover: 0 same region, zone
// and sub-zone (here: member), 1 same region and zone, 2 same region, 3
// another region, 4 a region the client's failover rule does not name;
// composed with the priorities already given (×5) and compacted.
func localityFailover(locs []placed, client Locality, failover []*networking.LocalityLoadBalancerSetting_Failover, prio []uint32) {
	for i, loc := range locs {
		p := uint32(3)
		switch {
		case client.Region == loc.region && client.Zone == loc.zone && client.Member == loc.member:
			p = 0
		case client.Region == loc.region && client.Zone == loc.zone:
			p = 1
		case client.Region == loc.region:
			p = 2
		}
		if p == 3 {
			for _, f := range failover {
				if f.GetFrom() == client.Region {
					if loc.region != f.GetTo() {
						p = 4
					}
					break
				}
			}
		}
		prio[i] = prio[i]*5 + p
	}
	compact(prio)
}

// distributeWeights is istiod's applyLocalityWeights: the first rule whose
// from matches the client gives each locality matched by one of its to
// entries that entry's share of the weight, split by the localities' own
// weights; localities no entry matches are left out (weight 0).
func distributeWeights(locs []placed, base []uint32, client Locality, rules []*networking.LocalityLoadBalancerSetting_Distribute) []uint32 {
	for _, d := range rules {
		if !localityMatch(client.Region, client.Zone, client.Member, d.GetFrom()) {
			continue
		}
		weights := make([]uint32, len(locs))
		matched := make([]bool, len(locs))
		tos := make([]string, 0, len(d.GetTo()))
		for to := range d.GetTo() {
			tos = append(tos, to)
		}
		// istiod walks the map in random order; the hub gives each
		// locality to the most specific entry that matches it.
		sort.Slice(tos, func(i, j int) bool {
			if a, b := specificity(tos[i]), specificity(tos[j]); a != b {
				return a > b
			}
			return tos[i] < tos[j]
		})
		for _, to := range tos {
			share := d.GetTo()[to]
			var total uint32
			var mine []int
			for i, loc := range locs {
				if !matched[i] && localityMatch(loc.region, loc.zone, loc.member, to) {
					matched[i] = true
					mine = append(mine, i)
					total += base[i]
				}
			}
			for _, i := range mine {
				if w := float64(base[i]) * float64(share) / float64(total); w > 0 {
					weights[i] = uint32(math.Ceil(w))
				} else {
					weights[i] = base[i] // as istiod: a weight of 0 leaves the locality's own
				}
			}
		}
		return weights
	}
	return nil
}

// localityMatch is istiod's util.LocalityMatch: a rule "region/zone/sub-zone"
// where "*" or a missing part matches anything (the region must be given).
func localityMatch(region, zone, subzone, rule string) bool {
	parts := strings.Split(rule, "/")
	for len(parts) < 3 {
		parts = append(parts, "")
	}
	return (parts[0] == "*" || parts[0] == region) &&
		(parts[1] == "*" || parts[1] == "" || parts[1] == zone) &&
		(parts[2] == "*" || parts[2] == "" || parts[2] == subzone)
}

// specificity counts the parts of a locality rule that are not wildcards.
func specificity(rule string) int {
	n := 0
	for _, p := range strings.Split(rule, "/") {
		if p != "" && p != "*" {
			n++
		}
	}
	return n
}

// compact renumbers priorities 0..N in order without gaps, as Envoy and
// grpc-go require.
func compact(prio []uint32) {
	distinct := map[uint32]struct{}{}
	for _, p := range prio {
		distinct[p] = struct{}{}
	}
	order := make([]uint32, 0, len(distinct))
	for p := range distinct {
		order = append(order, p)
	}
	sort.Slice(order, func(i, j int) bool { return order[i] < order[j] })
	rank := make(map[uint32]uint32, len(order))
	for i, p := range order {
		rank[p] = uint32(i)
	}
	for i, p := range prio {
		prio[i] = rank[p]
	}
}

// portLevel is a rule's first portLevelSettings entry for port, which
// replaces its whole traffic policy for that port, as in Istio; nil when
// none names it.
func portLevel(dr *networking.DestinationRule, port int32) *networking.TrafficPolicy_PortTrafficPolicy {
	for _, pl := range dr.GetTrafficPolicy().GetPortLevelSettings() {
		if pl.GetPort() != nil && int32(pl.GetPort().GetNumber()) == port {
			return pl
		}
	}
	return nil
}
