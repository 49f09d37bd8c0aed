package distribute

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
)

// served is what one discovery found: for each kind of the table the home
// cluster serves, the version to watch it in; the groups whose discovery
// failed (their kinds are left as they are); and the Istio kinds served
// that the table does not know.
type served struct {
	versions     map[string]string // kind name -> served version
	failedGroups map[string]error
	unsupported  []string
}

// discover asks the discovery API which Istio kinds are served, and in which
// version: the group's most preferred version that serves the kind.
func (s *Source) discover(ctx context.Context) (served, error) {
	out := served{versions: map[string]string{}, failedGroups: map[string]error{}}
	dc, ok := s.disco.(discovery.DiscoveryInterfaceWithContext)
	if !ok {
		return out, errors.New("discovery client without context support")
	}
	apiGroups, lists, err := dc.ServerGroupsAndResourcesWithContext(ctx)
	if err != nil {
		var failed *discovery.ErrGroupDiscoveryFailed
		if !errors.As(err, &failed) {
			return out, fmt.Errorf("discovering the home cluster's API groups: %w", err)
		}
		for gv, gerr := range failed.Groups {
			if groups[gv.Group] {
				out.failedGroups[gv.Group] = gerr
			}
		}
	}
	byGV := map[string][]string{} // group/version -> kinds
	for _, l := range lists {
		if l == nil {
			continue
		}
		for _, r := range l.APIResources {
			if !strings.Contains(r.Name, "/") {
				byGV[l.GroupVersion] = append(byGV[l.GroupVersion], r.Kind)
			}
		}
	}
	unsupported := map[string]bool{}
	for _, g := range apiGroups {
		if g == nil || !groups[g.Name] {
			continue
		}
		versions := g.Versions
		if g.PreferredVersion.Version != "" {
			// PreferredVersion first, then the rest in the server's order.
			versions = append(versions[:0:0], g.PreferredVersion)
			for _, v := range g.Versions {
				if v.Version != g.PreferredVersion.Version {
					versions = append(versions, v)
				}
			}
		}
		for _, v := range versions {
			for _, kind := range byGV[schema.GroupVersion{Group: g.Name, Version: v.Version}.String()] {
				k, ok := lookup(g.Name, kind)
				if !ok {
					unsupported[g.Name+"/"+kind] = true
					continue
				}
				if _, seen := out.versions[k.name()]; !seen {
					out.versions[k.name()] = v.Version
				}
			}
		}
	}
	for k := range unsupported {
		out.unsupported = append(out.unsupported, k)
	}
	sort.Strings(out.unsupported)
	return out, nil
}

// refresh runs one discovery and starts, restarts or stops watches to match.
// A failed discovery leaves every watch as it is.
func (s *Source) refresh(ctx context.Context) {
	found, err := s.discover(ctx)
	if ctx.Err() != nil {
		return
	}
	var stopped []*watcher
	var changed []string
	s.mu.Lock()
	if err != nil {
		if s.discoveryErr != err.Error() {
			s.log.Warn("discovery failed; keeping the watched kinds as they are", "err", err)
		}
		s.discoveryErr = err.Error()
		s.mu.Unlock()
		return
	}
	first := !s.discovered
	s.discovered, s.discoveryErr, s.lastDiscovery = true, "", time.Now()
	if strings.Join(s.unsupported, ",") != strings.Join(found.unsupported, ",") && len(found.unsupported) > 0 {
		s.log.Info("Istio kinds served without a known spec proto are not distributed", "kinds", found.unsupported)
	}
	s.unsupported = found.unsupported
	for name, st := range s.states {
		if gerr, failed := found.failedGroups[st.info.group]; failed {
			if st.w == nil {
				st.message = fmt.Sprintf("discovery of %s failed: %v", st.info.group, gerr)
			}
			continue
		}
		version, ok := found.versions[name]
		switch {
		case ok && st.w != nil && st.served == version:
			// Watched as it should be.
		case ok:
			if st.w != nil {
				stopped = append(stopped, st.w)
				s.log.Info("watching a kind in another version", "kind", name, "from", st.served, "to", version)
			} else {
				s.log.Info("watching kind for distribution", "kind", name, "version", version)
			}
			if len(st.objects) > 0 {
				changed = append(changed, name)
			}
			clear(st.objects)
			clear(st.rejected)
			st.served, st.message, st.ready = version, "", false
			st.w = s.startWatch(ctx, st.info, st.info.gvr(version))
		default:
			if st.w != nil {
				stopped = append(stopped, st.w)
				s.log.Info("kind no longer served; its objects are no longer distributed", "kind", name)
			}
			if len(st.objects) > 0 || first || st.w != nil {
				changed = append(changed, name)
			}
			clear(st.objects)
			clear(st.rejected)
			st.w, st.served, st.ready = nil, "", true
			st.message = fmt.Sprintf("not served by the home cluster (no CRD %s.%s installed)", st.info.resource, st.info.group)
		}
	}
	s.mu.Unlock()
	for _, w := range stopped {
		w.stop()
	}
	sort.Strings(changed)
	for _, k := range changed {
		s.notify(k)
	}
}

// stopAll stops every watch and waits for it.
func (s *Source) stopAll() {
	s.mu.Lock()
	var ws []*watcher
	for _, st := range s.states {
		if st.w != nil {
			ws = append(ws, st.w)
		}
	}
	s.mu.Unlock()
	for _, w := range ws {
		w.stop()
	}
}
