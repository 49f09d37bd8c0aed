// Package distribute is the source of mesh-wide Istio policy authored once:
// Istio objects in the home cluster labelled hub.federation/distribute=true,
// in the namespaces the operator names (Options.Namespaces; objects
// labelled elsewhere are left out and reported), of every Istio kind whose
// CRD the home cluster serves, converted to their istio.io/api protos: the
// MCP config generator serves them to every member's istiod unchanged
// (docs/architecture.md §3.7), and the hub's own xDS reads the rules it
// applies itself (Rules: DestinationRules, security policies).
//
// Which kinds are served is asked of the discovery API at start and then
// every Options.Rediscover (a periodic refresh rather than a CRD informer:
// it needs no permission on CustomResourceDefinitions, and it sees a kind
// only once the API server serves it, which a CRD event does not promise).
// A kind whose CRD is missing is reported in Status and watched once it
// appears; one whose CRD goes away is dropped. Each served kind is watched
// by its own dynamic informer restricted to the label. A spec that does not
// convert is left out and reported on its object as a Warning Event, once
// per generation.
package distribute

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Label marks an Istio object of the home cluster for distribution; its
// value must be "true".
const Label = "hub.federation/distribute"

// RejectedReason is the reason of the Warning Event recorded on an object
// whose spec does not convert to its kind's proto.
const RejectedReason = "DistributionRejected"

// Options configures a Source.
type Options struct {
	// Rediscover is how often the discovery API is asked which Istio kinds
	// the home cluster serves; zero means 30 s.
	Rediscover time.Duration
	// OnChange, when set, is called with a kind's name (as in Object.Kind)
	// when its objects changed or it became ready (Objects). It is called
	// from the Source's goroutines, concurrently for different kinds, and
	// must not block.
	OnChange func(kind string)
	// Namespaces are the namespaces objects are distributed from; an
	// object labelled in any other is left out and reported. Empty: none.
	Namespaces []string
	// Hosts refuses objects that name hosts the hub owns.
	Hosts HostGuard
	// Recheck is how often the objects that name hosts are checked again
	// against Hosts.Federated (the federated Services change); zero
	// means 5 s.
	Recheck time.Duration
	// MayWrite, when set, tells whether this replica may record Events
	// (e.g. leader.Elector.IsLeader): a rejection seen while it returns
	// false is recorded on the object's next change seen as leader. Nil
	// means always.
	MayWrite func() bool
	// Log receives the Source's messages; nil means slog.Default().
	Log *slog.Logger
}

// Source watches the home cluster for distributed Istio objects. Create it
// with New, run it with Run; Objects and Status may be called at any time.
type Source struct {
	dyn    dynamic.Interface
	disco  discovery.DiscoveryInterface
	kube   kubernetes.Interface
	opts   Options
	log    *slog.Logger
	states map[string]*kindState // every kind of the table, by name; the map is fixed

	mu            sync.Mutex
	discovered    bool // a discovery succeeded at least once
	discoveryErr  string
	lastDiscovery time.Time
	unsupported   []string // Istio kinds served that the table does not know
	// noted are the notes whose Events were recorded (see recordNotes).
	noted map[noteKey]bool
	// noteKick wakes Run to record new notes' Events.
	noteKick chan struct{}
}

// kindState is what the Source knows of one kind; guarded by Source.mu.
type kindState struct {
	info     kindInfo
	w        *watcher // nil while not watched
	served   string   // group/version watched
	message  string   // why not watched, or the last error of its watch
	ready    bool     // its watch synced (or it is not served)
	objects  map[string]Object
	rejected map[string]rejection // by namespace/name
	notes    []Note               // what the hub's xDS does differently (SetNotes)
}

// rejection is an object left out, by uid, generation and reason, so
// that each is reported once.
type rejection struct {
	uid        types.UID
	generation int64
	reason     string  // Reason*
	message    string  // for Status
	object     *Object // the converted object, when its hosts are what is refused
	reported   bool    // its Event was recorded (or attempted)
}

// sameAs reports whether r is the same rejection as o, already reported
// or not.
func (r rejection) sameAs(o rejection) bool {
	return r.uid == o.uid && r.generation == o.generation && r.reason == o.reason && r.message == o.message
}

// mayWrite reports whether this replica records Events.
func (s *Source) mayWrite() bool { return s.opts.MayWrite == nil || s.opts.MayWrite() }

// New builds a Source reading the home cluster through cfg.
func New(cfg *rest.Config, opts Options) (*Source, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if opts.Rediscover <= 0 {
		opts.Rediscover = 30 * time.Second
	}
	if opts.Recheck <= 0 {
		opts.Recheck = 5 * time.Second
	}
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	s := &Source{dyn: dyn, disco: disco, kube: kube, opts: opts, log: log.With("component", "distribute"),
		states: map[string]*kindState{}, noted: map[noteKey]bool{}, noteKick: make(chan struct{}, 1)}
	for _, k := range kinds {
		s.states[k.name()] = &kindState{info: k, objects: map[string]Object{}, rejected: map[string]rejection{}}
	}
	return s, nil
}

// Run discovers the served Istio kinds now and every Options.Rediscover,
// watching each, and checks the objects that name hosts again every
// Options.Recheck, until ctx is done; it returns after every watch stopped.
func (s *Source) Run(ctx context.Context) error {
	defer s.stopAll()
	t := time.NewTicker(s.opts.Rediscover)
	defer t.Stop()
	recheck := time.NewTicker(s.opts.Recheck)
	defer recheck.Stop()
	s.refresh(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.refresh(ctx)
		case <-recheck.C:
			s.recheckHosts(ctx)
			s.recordNotes(ctx) // those that failed, or came while this replica could not write
		case <-s.noteKick:
			s.recordNotes(ctx)
		}
	}
}

// Objects returns the distributed objects of a kind (as istiod names it,
// see Kinds), sorted by namespace and name. ready is false until the kind
// is known to be complete: before the first discovery, and while its watch
// has not synced. A kind the home cluster does not serve is ready and
// empty. While a kind is not ready (its watch is starting, or restarting
// in another served version) its objects may be incomplete: keep serving
// what was served before. The Objects are shared: do not modify them. A
// kind not in Kinds is never ready.
func (s *Source) Objects(kind string) (objects []Object, ready bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.states[kind]
	if st == nil {
		return nil, false
	}
	objects = make([]Object, 0, len(st.objects))
	for _, o := range st.objects {
		objects = append(objects, o)
	}
	sort.Slice(objects, func(i, j int) bool {
		if objects[i].Namespace != objects[j].Namespace {
			return objects[i].Namespace < objects[j].Namespace
		}
		return objects[i].Name < objects[j].Name
	})
	return objects, s.discovered && st.ready
}

// Rules returns the objects of a kind that the hub's own xDS reads: the
// distributed ones; those held back only because they name a host the hub
// owns (ReasonHost), which are about exactly the hosts it serves
// (DestinationRules of federated hosts: see HostGuard); and, with a nil
// Spec, the AuthorizationPolicies and PeerAuthentications of the
// namespaces distribution is allowed from whose spec does not convert
// (ReasonSpec): a policy the hub cannot read is still there, and the
// hub's xDS fails closed on it. Sorted and ready as
// Objects; OnChange reports their changes too.
func (s *Source) Rules(kind string) (objects []Object, ready bool) {
	s.mu.Lock() // one look at both lists: an object moving between them is in exactly one
	st := s.states[kind]
	if st == nil {
		s.mu.Unlock()
		return nil, false
	}
	for _, o := range st.objects {
		objects = append(objects, o)
	}
	for _, r := range st.rejected {
		if r.object != nil && (r.reason == ReasonHost || r.reason == ReasonSpec) {
			objects = append(objects, *r.object)
		}
	}
	ready = s.discovered && st.ready
	s.mu.Unlock()
	sort.Slice(objects, func(i, j int) bool {
		if objects[i].Namespace != objects[j].Namespace {
			return objects[i].Namespace < objects[j].Namespace
		}
		return objects[i].Name < objects[j].Name
	})
	return objects, ready
}

// notify tells OnChange that kind changed.
func (s *Source) notify(kind string) {
	if s.opts.OnChange != nil {
		s.opts.OnChange(kind)
	}
}

// gvr is the resource a kind is watched through, in the served version.
func (k kindInfo) gvr(version string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: k.group, Version: version, Resource: k.resource}
}
