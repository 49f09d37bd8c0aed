package hub

import (
	"context"
	"sync"
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

func has[K comparable](m map[K]struct{}, k K) bool {
	_, ok := m[k]
	return ok
}

// add puts k in the set *m, making it if needed.
func add[K comparable](m *map[K]struct{}, k K) {
	if *m == nil {
		*m = map[K]struct{}{}
	}
	(*m)[k] = struct{}{}
}
