package hub

import (
	"errors"
	"time"

	"github.com/hubmesh/hub/clusters"
)

// Changes is the hub's change feed: the federated Index (hostnames), the
// member registry (Secrets) and trust federation (roots) report to it what
// changed, and the one Hub built with it (Options.Changes) pushes those
// changes to proxies. It is built first, so that every part that reports to
// it and the Hub that consumes it can be built complete, in dependency
// order. Reports never block and may come before the Hub runs: they wait
// for Hub.Run.
type Changes struct {
	debounce *debouncer
}

// NewChanges returns an empty feed.
func NewChanges() *Changes { return &Changes{debounce: newDebouncer(0, 0, nil)} }

// HostnamesChanged reports the hostnames whose federated view changed (the
// Index's onChange).
func (c *Changes) HostnamesChanged(hostnames []string) { c.debounce.add(hostnames) }

// SecretChanged reports that a member's Secret changed (SDS pushes).
func (c *Changes) SecretChanged(cluster string, key clusters.ServiceKey) {
	c.debounce.add([]string{sdsKey})
}

// RootsChanged reports that a trust domain's roots changed (SDS pushes).
func (c *Changes) RootsChanged() { c.debounce.add([]string{sdsKey}) }

// consume makes push the feed's one consumer, batching changes as
// DebounceAfter and DebounceMax say; it is called by New, before Run.
func (c *Changes) consume(after, max time.Duration, push func(map[string]struct{}, time.Time)) (*debouncer, error) {
	if c.debounce.push != nil {
		return nil, errors.New("the change feed already has a hub")
	}
	c.debounce.after, c.debounce.max, c.debounce.push = after, max, push
	return c.debounce, nil
}
