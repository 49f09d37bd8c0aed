package clusters

import (
	"fmt"
	"sync/atomic"

	"k8s.io/client-go/tools/cache"
)

// kindCounts counts a member's objects by kind (fixed at construction).
type kindCounts map[string]*atomic.Int64

func newKindCounts(kinds ...string) kindCounts {
	out := make(kindCounts, len(kinds))
	for _, k := range kinds {
		out[k] = new(atomic.Int64)
	}
	return out
}

// total is the sum over every kind.
func (k kindCounts) total() int64 {
	var n int64
	for _, v := range k {
		n += v.Load()
	}
	return n
}

// objectCap bounds the objects a member's informers hold
// (--member-max-objects): held counts them, and overflowed is set once the
// count passed max (0: no cap).
type objectCap struct {
	max        int
	held       atomic.Int64
	overflowed atomic.Bool
	// counts are the objects the member-wide informers hold (Nodes,
	// Secrets), by kind; each watch counts its own.
	counts kindCounts
	// overflow is called once, when the count first passes max.
	overflow func()
}

// counting wraps an informer's handler so that it also counts the objects
// the informer holds, as kind in counts and in the member's total, and
// stops the member once the total passes its cap (Services,
// EndpointSlices, Nodes, Secrets, mesh pods and ServiceExports). The
// counts follow the informer's add and delete notifications, so they cost
// nothing per object held, and no listener of their own. The cap bounds
// what stays in memory; one oversize list is still decoded once before the
// member is stopped.
func (o *objectCap) counting(counts kindCounts, kind string, h cache.ResourceEventHandlerFuncs) cache.ResourceEventHandlerFuncs {
	n := counts[kind]
	add, del := h.AddFunc, h.DeleteFunc
	h.AddFunc = func(obj any) {
		n.Add(1)
		if o.held.Add(1) > int64(o.max) && o.max > 0 && o.overflowed.CompareAndSwap(false, true) {
			o.overflow()
		}
		if add != nil {
			add(obj)
		}
	}
	h.DeleteFunc = func(obj any) {
		n.Add(-1)
		o.held.Add(-1)
		if del != nil {
			del(obj)
		}
	}
	return h
}

// overflow makes the member Invalid and stops its informers and endpoint
// controller; run then withdraws whatever it had published. Other members
// are not affected. It runs once, from an informer's notification.
func (c *Cluster) overflow() {
	c.health.invalid(fmt.Sprintf("the member holds more than %d objects (Services, EndpointSlices, Nodes, Secrets and mesh pods; --member-max-objects); its informers are stopped and its services are not served", c.objects.max))
	c.log.Warn("member exceeds its object cap; stopped", "max_objects", c.objects.max)
	c.cancel()
	c.views.stop()
}

// withdrawIfOverflowed drops the member's services from the Sink after an
// overflow stopped a member that had published them.
func (c *Cluster) withdrawIfOverflowed() {
	if !c.objects.overflowed.Load() {
		return
	}
	c.sink.RemoveCluster(c.id)
	c.health.publishedAll(nil)
}
