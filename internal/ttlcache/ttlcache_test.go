package ttlcache

import (
	"testing"
	"time"
)

func TestExpiryAndSize(t *testing.T) {
	now := time.Unix(1000, 0)
	c := New[string, int](2, time.Minute)
	c.now = func() time.Time { return now }
	c.Add("a", 1)
	if v, ok := c.Get("a"); !ok || v != 1 {
		t.Fatalf("Get(a) = %v, %v", v, ok)
	}
	now = now.Add(59 * time.Second)
	if _, ok := c.Get("a"); !ok {
		t.Fatal("a expired before its ttl")
	}
	now = now.Add(time.Second)
	if _, ok := c.Get("a"); ok {
		t.Fatal("a outlived its ttl")
	}
	c.Add("b", 2)
	c.Add("c", 3)
	c.Add("d", 4) // pushes out b, the least recently used
	if _, ok := c.Get("b"); ok {
		t.Fatal("the cache holds more than its size")
	}
	if v, ok := c.Get("d"); !ok || v != 4 {
		t.Fatalf("Get(d) = %v, %v", v, ok)
	}
}
