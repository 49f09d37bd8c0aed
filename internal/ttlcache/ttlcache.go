// Package ttlcache is a size-bounded LRU whose entries expire a fixed time
// after they were added. Expired entries are dropped when they are read or
// pushed out by newer ones: unlike golang-lru's expirable LRU it runs no
// goroutine, so nothing outlives its owner.
package ttlcache

import (
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// Cache maps keys to values for ttl after each Add, holding at most size.
// It is safe for concurrent use.
type Cache[K comparable, V any] struct {
	ttl     time.Duration
	now     func() time.Time
	entries *lru.Cache[K, entry[V]]
}

type entry[V any] struct {
	value   V
	expires time.Time
}

// New returns an empty cache; size must be positive.
func New[K comparable, V any](size int, ttl time.Duration) *Cache[K, V] {
	entries, err := lru.New[K, entry[V]](size)
	if err != nil {
		panic(err) // only a size ≤ 0 fails: a programming error
	}
	return &Cache[K, V]{ttl: ttl, now: time.Now, entries: entries}
}

// Get returns k's value if it was added less than ttl ago.
func (c *Cache[K, V]) Get(k K) (V, bool) {
	e, ok := c.entries.Get(k)
	if !ok {
		var zero V
		return zero, false
	}
	if !c.now().Before(e.expires) {
		c.entries.Remove(k)
		var zero V
		return zero, false
	}
	return e.value, true
}

// Add stores v under k for ttl from now.
func (c *Cache[K, V]) Add(k K, v V) {
	c.entries.Add(k, entry[V]{value: v, expires: c.now().Add(c.ttl)})
}

// Remove drops k's value, if any.
func (c *Cache[K, V]) Remove(k K) {
	c.entries.Remove(k)
}
