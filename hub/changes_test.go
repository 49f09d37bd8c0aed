package hub

import (
	"testing"

	"github.com/hubmesh/hub/clusters"
)

// TestChangesBuiltFirst: the feed and the index are built before the hub
// (as cmd/hub does); what they report before the hub exists waits for it,
// and a feed has one hub.
func TestChangesBuiltFirst(t *testing.T) {
	changes := NewChanges()
	index := NewIndex("cluster.local", changes.HostnamesChanged)
	index.ReplaceCluster("west", []*clusters.Service{{Namespace: "demo", Name: "echo"}})
	changes.SecretChanged("west", clusters.ServiceKey{Namespace: "demo", Name: "gw"})
	changes.RootsChanged()
	h, err := New(Options{Index: index, Changes: changes})
	if err != nil {
		t.Fatal(err)
	}
	if h.index != index {
		t.Errorf("the hub does not serve the index it was given")
	}
	got := h.debounce.take()
	for _, key := range []string{"echo.demo.svc.cluster.local", sdsKey} {
		if _, ok := got[key]; !ok {
			t.Errorf("change %q reported before the hub was built is lost: %v", key, got)
		}
	}
	if _, err := New(Options{Index: index, Changes: changes}); err == nil {
		t.Errorf("a second hub on the same feed was accepted")
	}
	if _, err := New(Options{Index: NewIndex("cluster.local", nil)}); err == nil {
		t.Errorf("an index without its feed was accepted")
	}
}
