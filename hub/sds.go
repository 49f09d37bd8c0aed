package hub

import (
	"context"
	"errors"
	"fmt"
	"sync"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/hubmesh/hub/hub/authn"
	"github.com/hubmesh/hub/hub/feed"
	"github.com/hubmesh/hub/hub/sds"
	"github.com/hubmesh/hub/hub/xdsgen"
)

// SecretAuthorizer answers whether a service account may list Secrets of a
// namespace in a member cluster (clusters.Registry implements it).
type SecretAuthorizer interface {
	CanListSecrets(ctx context.Context, cluster, saNamespace, saName, namespace string) (bool, error)
}

// withheldLog remembers which SDS names a stream was told it may not have,
// so that each is logged once per stream rather than on every push. It
// belongs to the stream (streamRecord.withheld), not to its identity: a
// token's identity is cached and shared by every stream that presents it.
type withheldLog struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

// maxWithheldLogged bounds what a stream's withheldLog remembers; past it
// nothing more is logged for that stream.
const maxWithheldLogged = 256

// first reports whether (name, reason) is new for the stream, and whether
// this is the entry that fills the log (logged with a note that more are
// not).
func (l *withheldLog) first(name, reason string) (first, last bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := name + "\x00" + reason
	if _, ok := l.seen[key]; ok || len(l.seen) >= maxWithheldLogged {
		return false, false
	}
	if l.seen == nil {
		l.seen = map[string]struct{}{}
	}
	l.seen[key] = struct{}{}
	return true, len(l.seen) == maxWithheldLogged
}

// secretResources builds the SDS resources a watch asked for, as istiod
// does: only to a verified identity of our trust domain, Secrets of the
// member its credential proves, of the proxy's own namespace or of another
// namespace whose Secrets its service account may list there (a
// SubjectAccessReview in that member, see secret); also roots (ROOTCA, a
// trust domain's bundle) and its own workload certificate ("default").
// Names it may not have are left out (and logged once per stream and
// reason), never an error for the stream.
func (w *watcher) secretResources(wt *watch) ([]*xdsgen.Resource, error) {
	var out []*xdsgen.Resource
	var reviews map[feed.ReviewKey]struct{}
	id := w.identityOf(wt)
	wt.awaiting = false
	defer func() {
		// Pushes read it, possibly while this runs on the stream's goroutine.
		w.mu.Lock()
		wt.sub.reviews = reviews
		w.mu.Unlock()
	}()
	var others map[string]struct{} // namespaces other than the proxy's its names ask for
	for _, name := range wt.names {
		var msg proto.Message
		var review *feed.ReviewKey
		var err error
		if ns, ok := sds.OtherNamespace(name, id.Namespace); ok && len(others) >= sds.MaxOtherNamespaces && !has(others, ns) {
			// Each other namespace costs an access review in the member:
			// a client cannot make the hub ask for thousands.
			err = fmt.Errorf("%w: the subscription names Secrets of more than %d namespaces other than %s", sds.ErrDenied, sds.MaxOtherNamespaces, id.Namespace)
		} else {
			if ok {
				add(&others, ns)
			}
			if name == xdsgen.SDSWorkloadCert {
				msg, err = w.workload.secret(&wt.rec.workload, id, w.roots)
			} else {
				msg, review, err = w.sds.Secret(id, name)
			}
		}
		if review != nil {
			add(&reviews, *review)
		}
		if errors.Is(err, sds.ErrReviewPending) {
			wt.awaiting = true
		} else if err != nil {
			if first, last := wt.rec.withheld.first(name, err.Error()); first {
				w.scope.Count("sds", err)
				w.log.Warn("SDS resource withheld", "proxy", wt.nodeID, "cluster", id.Cluster, "identity", id.SpiffeID.String(), "resource", name, "reason", err,
					"moreNotLogged", last)
			}
		}
		if err != nil {
			if v, ok := wt.held.version(name); ok && sds.Transient(err) {
				out = append(out, &xdsgen.Resource{Name: name, Version: v, Kept: true})
			}
			continue
		}
		r, err := xdsgen.Marshal(name, resourcev3.SecretType, msg)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func has[K comparable](m map[K]struct{}, k K) bool {
	_, ok := m[k]
	return ok
}

// identityOf is the identity of wt's stream as its loop last told it
// (conn.identified): a claim that puts a proxy in conflict mid-stream (see
// proxyTracker.claim) applies to the watches parked before it too.
func (w *watcher) identityOf(wt *watch) authn.Identity { return w.streamIdentity(wt.rec) }

// add puts k in the set *m, making it if needed.
func add[K comparable](m *map[K]struct{}, k K) {
	if *m == nil {
		*m = map[K]struct{}{}
	}
	(*m)[k] = struct{}{}
}
