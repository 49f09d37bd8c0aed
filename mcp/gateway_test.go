package mcp

import (
	"reflect"
	"testing"

	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
)

// Every member istiod gets the hub's EnvoyFilter for east-west gateways, in
// the root namespace: it selects the east-west gateways' pods, patches
// only their 15443 listener's filter chains, and appends h2 to their ALPNs
// (a MERGE, so Istio's own ALPNs stay).
func TestGatewayFilter(t *testing.T) {
	g := New(&fakeIndex{}, Options{RootNamespace: "mesh-root"})
	set, err := g.Set("networking.istio.io/v1alpha3/EnvoyFilter", "west")
	if err != nil || len(set.Resources) != 1 {
		t.Fatalf("Set = %d resources, %v; want 1", len(set.Resources), err)
	}
	var r mcpapi.Resource
	if err := set.Resources[0].UnmarshalTo(&r); err != nil {
		t.Fatal(err)
	}
	if r.Metadata.Name != "mesh-root/"+GatewayFilterName || r.Metadata.Version == "" || r.Metadata.Labels[LabelManagedBy] != ManagedBy {
		t.Errorf("metadata %v", r.Metadata)
	}
	var f networking.EnvoyFilter
	if err := r.Body.UnmarshalTo(&f); err != nil {
		t.Fatal(err)
	}
	if got := f.GetWorkloadSelector().GetLabels(); len(got) != 1 || got[EastWestGatewayLabel] != EastWestGatewayValue {
		t.Errorf("selector %v", got)
	}
	if len(f.ConfigPatches) != 1 {
		t.Fatalf("%d patches", len(f.ConfigPatches))
	}
	p := f.ConfigPatches[0]
	if p.ApplyTo != networking.EnvoyFilter_FILTER_CHAIN || p.Match.Context != networking.EnvoyFilter_GATEWAY ||
		p.Match.GetListener().GetPortNumber() != 15443 || p.Patch.Operation != networking.EnvoyFilter_Patch_MERGE {
		t.Errorf("patch %v", p)
	}
	want := map[string]any{"filter_chain_match": map[string]any{"application_protocols": []any{"h2"}}}
	if got := p.Patch.Value.AsMap(); !reflect.DeepEqual(got, want) {
		t.Errorf("patch value %v; want %v", got, want)
	}
	// The same bytes and version from another generator: nothing churns.
	again, _ := New(&fakeIndex{}, Options{RootNamespace: "mesh-root"}).Set("networking.istio.io/v1alpha3/EnvoyFilter", "east")
	if again.Version != set.Version || string(again.Resources[0].Value) != string(set.Resources[0].Value) {
		t.Error("two generators built different filters")
	}
}
