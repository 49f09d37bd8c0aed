package clusters

import (
	"fmt"

	"k8s.io/client-go/tools/cache"
)

// countObjects counts the objects the member's informers hold (Services,
// EndpointSlices, Nodes and Secrets) and stops the member once they pass
// its cap. The count follows the informers' add and delete notifications,
// so it costs nothing per object held. The cap bounds what stays in memory;
// one oversize list is still decoded once before the member is stopped.
func (c *Cluster) countObjects() error {
	if c.maxObjects <= 0 {
		return nil
	}
	counter := cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) {
			if c.objects.Add(1) > int64(c.maxObjects) {
				c.overflow()
			}
		},
		DeleteFunc: func(any) { c.objects.Add(-1) },
	}
	infs := []cache.SharedIndexInformer{c.secrets.inf}
	for _, inf := range c.informers {
		infs = append(infs, inf)
	}
	for _, inf := range infs {
		if _, err := inf.AddEventHandler(counter); err != nil {
			return fmt.Errorf("adding object counter: %w", err)
		}
	}
	return nil
}

// overflow makes the member Invalid and stops its informers and endpoint
// controller; run then withdraws whatever it had published. Other members
// are not affected. It runs once, from an informer's notification.
func (c *Cluster) overflow() {
	if !c.overflowed.CompareAndSwap(false, true) {
		return
	}
	c.transition(func() {
		c.state = StateInvalid
		c.message = fmt.Sprintf("the member holds more than %d objects (Services, EndpointSlices, Nodes, Secrets and mesh pods; --member-max-objects); its informers are stopped and its services are not served", c.maxObjects)
	})
	c.log.Warn("member exceeds its object cap; stopped", "max_objects", c.maxObjects)
	c.cancel()
	c.queue.ShutDown()
}

// withdrawIfOverflowed drops the member's services from the Sink after an
// overflow stopped a member that had published them.
func (c *Cluster) withdrawIfOverflowed() {
	if !c.overflowed.Load() {
		return
	}
	c.sink.RemoveCluster(c.id)
	c.mu.Lock()
	clear(c.endpoints)
	c.mu.Unlock()
}
