package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/hubmesh/hub/clusters"
	"github.com/hubmesh/hub/internal/localcluster"
)

// The layout of a run (documented in docs/performance.md):
//
//   - clusters: the home cluster "primary" (registered members live in its
//     remote Secret; it holds no services) and members "m001".."mNNN";
//   - every member has three Nodes, "node-0".."node-2", in zones
//     "zone-a".."zone-c" of region "region-<member>", so every member
//     contributes three localities to a service;
//   - service i ("svc-00042" in namespace "bench") is a headless Service with
//     one port "http" 80 → 8080 in ServiceMembers consecutive members,
//     starting at member i mod Members, so services spread evenly over the
//     members and every service is federated across several of them;
//   - its Endpoints/Services endpoints (the remainder goes to the first
//     services) are split evenly between its members, one EndpointSlice
//     "<name>-hub" per member, endpoints round-robin over the member's nodes;
//   - addresses are unique, counting up from 198.18.0.1 (benchmark range,
//     never dialled); writes add addresses after the initial ones;
//   - stream j watches (is measured on) ServicesPerStream services drawn at
//     random (seeded) without repetition, so every service has about
//     Streams×ServicesPerStream/Services watchers; with the envoy and
//     istiod shapes every stream watches every service.
//
// The scale mode (--apiservers, scale.go) places members differently; see
// placeScale.

const (
	benchNamespace = "bench"
	hubNamespace   = "hub-system"
	homeID         = "primary"
	servicePort    = 80
	targetPort     = 8080
	portName       = "http"
	nodesPerMember = 3
	domainSuffix   = "cluster.local"
)

// maxAddresses is how many endpoint addresses 198.18.0.0/15 gives us
// (without .0 of the first /24 and the broadcast-looking last address).
const maxAddresses = 1<<17 - 2

// maxScaleAddresses is how many the scale mode has: after those of
// 198.18.0.0/15 it goes on in 100.64.0.0/10 (shared address space, RFC
// 6598; never dialled either), the same way.
const maxScaleAddresses = maxAddresses + 1<<22 - 2

var zones = [nodesPerMember]string{"zone-a", "zone-b", "zone-c"}

// address is the n-th endpoint address (n from 0): 198.18.0.1 + n, and
// from n = maxAddresses on 100.64.0.1 + (n - maxAddresses).
func address(n int) string {
	var b [4]byte
	if n < maxAddresses {
		binary.BigEndian.PutUint32(b[:], (198<<24|18<<16)+uint32(n)+1)
	} else {
		binary.BigEndian.PutUint32(b[:], (100<<24|64<<16)+uint32(n-maxAddresses)+1)
	}
	return netip.AddrFrom4(b).String()
}

// service is one benchmark service and where it lives.
type service struct {
	name      string
	namespace string                   // benchNamespace, or in scale mode its team's
	cluster   string                   // its CDS/EDS cluster name, outbound|80||<hostname>
	members   []int                    // member indexes
	backend   [][]localcluster.Backend // per entry of members
	// headless: a Service without a cluster IP (the scale mode's: the hub
	// never uses cluster IPs, and the API servers allocate none).
	headless bool
}

func (s *service) host() string     { return hostname(s.namespace, s.name) }
func (s *service) listener() string { return listenerName(s.namespace, s.name) }
func (s *service) entry() string    { return serviceEntryName(s.namespace, s.name) }

// layout is every object a run creates and who watches what.
type layout struct {
	memberIDs []string
	// servers are the names of the member API servers (local clusters),
	// server[i] member i's index in them and namespace[i] the namespace
	// its services live in; without the scale mode servers are memberIDs
	// and every namespace is benchNamespace.
	servers   []string
	server    []int
	namespace []string
	// scale is the scale mode (Config.APIServers, scale.go).
	scale bool
	// written counts the writes made so far: each write adds the address
	// after the services' and the earlier writes' (measureWrites).
	written int
	// networks is Config.Networks (see memberNetwork).
	networks int
	services []*service
	// watched[i] lists the services stream i subscribes to.
	watched [][]int
	// watchers[s] lists the streams that subscribe to service s.
	watchers [][]int
	// bulk are the services the bulk phase creates (bulk.go).
	bulk []*service
}

func memberID(i int) string { return fmt.Sprintf("m%03d", i+1) }

// apiServerName is the scale mode's API server a's cluster name.
func apiServerName(a int) string { return fmt.Sprintf("api%02d", a+1) }

// teamNamespace is the namespace of the scale mode's team t: the members
// on different API servers with the same team index serve its services.
func teamNamespace(t int) string { return fmt.Sprintf("team-%03d", t) }

// memberNetwork is member i's Istio network ("" with one network).
func (l *layout) memberNetwork(i int) string {
	if l.networks <= 1 {
		return ""
	}
	return fmt.Sprintf("net-%d", i%l.networks)
}

// gatewayAddress is member i's east-west gateway address (never dialled).
func gatewayAddress(i int) string { return fmt.Sprintf("198.19.200.%d", i+1) }

func hostname(namespace, name string) string { return name + "." + namespace + ".svc." + domainSuffix }

func clusterName(namespace, name string) string {
	return fmt.Sprintf("outbound|%d||%s", servicePort, hostname(namespace, name))
}

// listenerName is the LDS (and RDS) name of a service's port, what a
// grpc-go client dialing xds:///<hostname>:<port> asks for.
func listenerName(namespace, name string) string {
	return fmt.Sprintf("%s:%d", hostname(namespace, name), servicePort)
}

func newLayout(cfg Config) *layout {
	l := &layout{networks: cfg.Networks, scale: cfg.scale()}
	for i := range cfg.Members {
		l.memberIDs = append(l.memberIDs, memberID(i))
	}
	if l.scale {
		l.placeScale(cfg)
	} else {
		l.place(cfg)
	}
	l.bulk = bulkServices(cfg)
	l.assignWatchers(cfg)
	return l
}

// place is the layout without the scale mode: one API server per member,
// services spread over the members as the comment at the top says.
func (l *layout) place(cfg Config) {
	l.servers = l.memberIDs
	for i := range cfg.Members {
		l.server = append(l.server, i)
		l.namespace = append(l.namespace, benchNamespace)
	}
	sm := cfg.serviceMembers()
	next := 0 // next address index
	for i := range cfg.Services {
		total := cfg.Endpoints / cfg.Services
		if i < cfg.Endpoints%cfg.Services {
			total++
		}
		l.services = append(l.services, placeService(fmt.Sprintf("svc-%05d", i), i, total, sm, cfg.Members, cfg.Networks > 1, &next))
	}
}

// placeScale is the scale mode's layout: member i is registered against
// API server i mod A and serves namespace team-<i / A>, which holds
// ServicesPerMember services svc-<k> of EndpointsPerService endpoints each
// on that API server. So the members with the same team index, on A
// different API servers, serve the same hostnames: each service is
// federated across (up to) A members, and the API server of member i
// holds the namespaces of all its members, (Members / A) × services.
// Addresses count up over (team, service, member, endpoint), each one
// distinct; every API server has the three Nodes of every member, in
// region region-<API server>.
func (l *layout) placeScale(cfg Config) {
	a := cfg.APIServers
	for s := range a {
		l.servers = append(l.servers, apiServerName(s))
	}
	for i := range cfg.Members {
		l.server = append(l.server, i%a)
		l.namespace = append(l.namespace, teamNamespace(i/a))
	}
	width := max(3, len(fmt.Sprint(cfg.ServicesPerMember-1)))
	next := 0
	for t := 0; t*a < cfg.Members; t++ {
		for k := range cfg.ServicesPerMember {
			s := &service{name: fmt.Sprintf("svc-%0*d", width, k), namespace: teamNamespace(t), headless: true}
			s.cluster = clusterName(s.namespace, s.name)
			for m := t * a; m < min((t+1)*a, cfg.Members); m++ {
				var backends []localcluster.Backend
				for e := range cfg.EndpointsPerService {
					backends = append(backends, localcluster.Backend{IP: address(next), Port: targetPort, Node: fmt.Sprintf("node-%d", e%nodesPerMember)})
					next++
				}
				s.members = append(s.members, m)
				s.backend = append(s.backend, backends)
			}
			l.services = append(l.services, s)
		}
	}
}

// assignWatchers decides which services each stream watches, for the
// shape of cfg (again for every shape of the scale mode).
func (l *layout) assignWatchers(cfg Config) {
	l.watched = nil
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6875626265))
	per := cfg.servicesPerStream()
	l.watchers = make([][]int, cfg.Services)
	var all []int // shared by every stream of the envoy and istiod shapes
	if cfg.Shape == shapeEnvoy || cfg.Shape == shapeIstiod {
		all = make([]int, cfg.Services)
		for i := range all {
			all[i] = i
		}
	}
	for j := range cfg.Streams {
		picked := all
		if picked == nil {
			picked = rng.Perm(cfg.Services)[:per]
		}
		l.watched = append(l.watched, picked)
		for _, s := range picked {
			l.watchers[s] = append(l.watchers[s], j)
		}
	}
}

// placeService is service number i, name, with total endpoints split
// between sm consecutive members from member i mod members, on addresses
// from *next on; with pods, each endpoint names its pod ep-<address index>.
func placeService(name string, i, total, sm, members int, pods bool, next *int) *service {
	s := &service{name: name, namespace: benchNamespace, cluster: clusterName(benchNamespace, name)}
	for k := range sm {
		n := total / sm
		if k < total%sm {
			n++
		}
		var backends []localcluster.Backend
		for e := range n {
			b := localcluster.Backend{IP: address(*next), Port: targetPort, Node: fmt.Sprintf("node-%d", e%nodesPerMember)}
			if pods {
				b.Pod = fmt.Sprintf("ep-%d", *next)
			}
			backends = append(backends, b)
			*next++
		}
		s.members = append(s.members, (i+k)%members)
		s.backend = append(s.backend, backends)
	}
	return s
}

// endpoints is the number of endpoints of a service in all members.
func (s *service) endpoints() int {
	n := 0
	for _, b := range s.backend {
		n += len(b)
	}
	return n
}

// job is one object to create in a member.
type job struct {
	member int
	run    func(context.Context, kubernetes.Interface) error
}

// serviceJobs create the services' Service and EndpointSlice in each of
// their members.
func serviceJobs(services []*service) []job {
	var out []job
	for _, s := range services {
		for k, m := range s.members {
			out = append(out, job{m, func(ctx context.Context, c kubernetes.Interface) error {
				if s.headless {
					return localcluster.ApplyService(ctx, c, s.namespace, s.name, portName, servicePort, s.backend[k])
				}
				// Cluster IPs, as real Services have, so that istiod (--peer)
				// serves them over EDS as it would in a mesh.
				return localcluster.ApplyClusterIPService(ctx, c, s.namespace, s.name, portName, servicePort, s.backend[k])
			}})
		}
	}
	return out
}

// create makes the namespaces, nodes, Services and EndpointSlices in the
// members (clients[i] is member i's API server's) with at most workers
// concurrent objects in flight.
func (l *layout) create(ctx context.Context, clients []kubernetes.Interface, workers int, progress func(string, ...any)) error {
	var prep []job
	for m := range clients {
		prep = append(prep, job{m, func(ctx context.Context, c kubernetes.Interface) error {
			return localcluster.EnsureNamespace(ctx, c, l.namespace[m])
		}})
		if l.server[m] != m {
			continue // the nodes are its API server's first member's
		}
		for n := range nodesPerMember {
			prep = append(prep, job{m, func(ctx context.Context, c kubernetes.Interface) error {
				return localcluster.ApplyNode(ctx, c, fmt.Sprintf("node-%d", n), "region-"+l.servers[l.server[m]], zones[n])
			}})
		}
	}
	if err := runJobs(ctx, clients, workers, prep, nil); err != nil {
		return err
	}
	if l.networks > 1 {
		if err := runJobs(ctx, clients, workers, l.networkJobs(len(clients)), nil); err != nil {
			return err
		}
	}
	objs := serviceJobs(l.services)
	return runJobs(ctx, clients, workers, objs, func(n int64) {
		if n%1000 == 0 {
			progress("created %d/%d (service, member) pairs", n, len(objs))
		}
	})
}

// runJobs runs every job with at most workers at once and stops at the
// first error; done, if set, is called with the count of jobs done after
// each one.
func runJobs(ctx context.Context, clients []kubernetes.Interface, workers int, batch []job, done func(n int64)) error {
	jobs := make(chan job)
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
		count atomic.Int64
	)
	for range workers {
		wg.Go(func() {
			for j := range jobs {
				if err := j.run(bctx, clients[j.member]); err != nil {
					once.Do(func() { first = fmt.Errorf("member %s: %w", memberID(j.member), err); cancel() })
					continue
				}
				if n := count.Add(1); done != nil {
					done(n)
				}
			}
		})
	}
feed:
	for _, j := range batch {
		select {
		case jobs <- j:
		case <-bctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// networkJobs put every member on its network (the label on istio-system),
// give it an east-west gateway (a labelled Service with an external IP)
// and create the pods its endpoints name, labelled for Istio mTLS (no
// kubelet runs them).
func (l *layout) networkJobs(members int) []job {
	var out []job
	for m := range members {
		network := l.memberNetwork(m)
		out = append(out, job{m, func(ctx context.Context, c kubernetes.Interface) error {
			if err := localcluster.EnsureNamespace(ctx, c, "istio-system"); err != nil {
				return err
			}
			ns, err := c.CoreV1().Namespaces().Get(ctx, "istio-system", metav1.GetOptions{})
			if err != nil {
				return err
			}
			ns.Labels = map[string]string{"topology.istio.io/network": network}
			if _, err := c.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
				return err
			}
			// It admits proxyless gRPC too (the grpc shape's mTLS
			// clients of other networks get it), and says so.
			gw := &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "eastwestgateway", Labels: map[string]string{"topology.istio.io/network": network},
					Annotations: map[string]string{clusters.AnnotationProxylessALPN: "true"}},
				Spec: corev1.ServiceSpec{ExternalIPs: []string{gatewayAddress(m)},
					Ports: []corev1.ServicePort{{Name: "tls", Port: 15443, Protocol: corev1.ProtocolTCP}}},
			}
			if _, err := c.CoreV1().Services("istio-system").Create(ctx, gw, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
			sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: benchNamespace, Name: "default"}}
			if _, err := c.CoreV1().ServiceAccounts(benchNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
			return nil
		}})
	}
	for _, s := range l.services {
		for k, m := range s.members {
			for _, b := range s.backend[k] {
				out = append(out, job{m, func(ctx context.Context, c kubernetes.Interface) error {
					pod := &corev1.Pod{
						ObjectMeta: metav1.ObjectMeta{Namespace: benchNamespace, Name: b.Pod, Labels: map[string]string{"security.istio.io/tlsMode": "istio"}},
						Spec: corev1.PodSpec{AutomountServiceAccountToken: ptr.To(false),
							Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app"}}},
					}
					_, err := c.CoreV1().Pods(benchNamespace).Create(ctx, pod, metav1.CreateOptions{})
					if apierrors.IsAlreadyExists(err) {
						return nil
					}
					return err
				}})
			}
		}
	}
	return out
}
