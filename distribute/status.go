package distribute

import (
	"sort"
	"time"
)

// Status is what the Source watches, for the API.
type Status struct {
	// Discovered is true once the home cluster's discovery API answered.
	Discovered bool `json:"discovered"`
	// LastDiscovery is when it last answered.
	LastDiscovery time.Time `json:"lastDiscovery,omitzero"`
	// DiscoveryError is the last discovery's error, if it failed.
	DiscoveryError string `json:"discoveryError,omitempty"`
	// Kinds has one entry per kind the Source can distribute, sorted.
	Kinds []KindStatus `json:"kinds"`
	// Unsupported are Istio kinds (group/Kind) the home cluster serves
	// that this hub knows no spec proto for: not distributed.
	Unsupported []string `json:"unsupported,omitempty"`
	// Objects and Rejected count the objects distributed and left out.
	Objects  int `json:"objects"`
	Rejected int `json:"rejected"`
}

// KindStatus is one kind's state.
type KindStatus struct {
	Kind string `json:"kind"` // as istiod names it
	// Served is the group/version watched; empty when not watched.
	Served string `json:"served,omitempty"`
	// Ready is true once the kind is complete (see Source.Objects).
	Ready   bool `json:"ready"`
	Objects int  `json:"objects"`
	// Rejected lists the objects left out, sorted by namespace/name.
	Rejected []Rejected `json:"rejected,omitempty"`
	// Message says why the kind is not watched (its CRD is missing), or
	// the latest error of its watch.
	Message string `json:"message,omitempty"`
	// Notes say what the hub's own xDS does with objects of the kind that
	// its clients cannot do as Istio means it (see Note).
	Notes []Note `json:"notes,omitempty"`
}

// Rejected is one object left out, and why (an Event on the object, reason
// DistributionRejected, says the same).
type Rejected struct {
	// Object is its namespace/name.
	Object string `json:"object"`
	// Reason is ReasonNamespace, ReasonHost or ReasonSpec.
	Reason string `json:"reason"`
	// Message says what is refused (never a conversion error, which may
	// quote the spec: that is only in the Event).
	Message string `json:"message"`
}

// Status returns the Source's current state.
func (s *Source) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := Status{Discovered: s.discovered, LastDiscovery: s.lastDiscovery, DiscoveryError: s.discoveryErr,
		Unsupported: append([]string(nil), s.unsupported...)}
	for _, name := range Kinds() {
		st := s.states[name]
		ks := KindStatus{Kind: name, Ready: s.discovered && st.ready, Objects: len(st.objects), Message: st.message, Notes: st.notes}
		if st.w != nil {
			ks.Served = st.info.group + "/" + st.served
		}
		for id, r := range st.rejected {
			ks.Rejected = append(ks.Rejected, Rejected{Object: id, Reason: r.reason, Message: r.message})
		}
		sort.Slice(ks.Rejected, func(i, j int) bool { return ks.Rejected[i].Object < ks.Rejected[j].Object })
		out.Objects += ks.Objects
		out.Rejected += len(ks.Rejected)
		out.Kinds = append(out.Kinds, ks)
	}
	return out
}
