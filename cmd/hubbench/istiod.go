package main

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/hubmesh/hub/mcp"
)

// The istiod shape: a member's istiod taking the federation as Istio config
// from the hub (MCP-over-XDS, docs/architecture.md §3.7), as Istio's adsc does in
// istiod's config controller: one SotW ADS stream; node metadata
// GENERATOR=api and ISTIO_VERSION, no CLUSTER_ID; a wildcard request for
// each of istiodConfigTypes, in that order; every response ACKed with its
// version and nonce, the node and no names; never a NACK. A write is
// measured at a stream when a ServiceEntry response holds the written
// service's ServiceEntry with the new endpoint.
const shapeIstiod = "istiod"

// istiodConfigTypes are the type URLs istiod (1.24 and later) subscribes
// to on its config-source stream, in its order.
var istiodConfigTypes = mcp.IstiodTypes()

const (
	serviceEntryType = "networking.istio.io/v1/ServiceEntry"
	// istioVersion is the ISTIO_VERSION the streams announce.
	istioVersion = "1.31.0"
	// serviceEntryPrefix is what the hub puts before a Service's name to
	// name its ServiceEntry (mcp.NamePrefix; docs/architecture.md §3.7).
	serviceEntryPrefix = "hub-"
)

// serviceEntryName is the MCP metadata.name of a benchmark service's
// ServiceEntry: <namespace>/hub-<name>.
func serviceEntryName(namespace, svc string) string {
	return namespace + "/" + serviceEntryPrefix + svc
}

// istiodKind is the short name of a config type URL (its Kind).
func istiodKind(typeURL string) string {
	return typeURL[strings.LastIndexByte(typeURL, '/')+1:]
}

// istiodNodeFor is the node istiod's adsc sends in every request.
func istiodNodeFor(id string) *corev3.Node {
	return &corev3.Node{Id: id, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"GENERATOR":     structpb.NewStringValue("api"),
		"ISTIO_VERSION": structpb.NewStringValue(istioVersion),
	}}}
}

// istiodState is what an istiod-shaped stream records besides the
// counters every stream has.
type istiodState struct {
	byKind   [len(istiodConfigTypes)]atomic.Int64 // responses per type, in istiodConfigTypes order
	answered atomic.Int64                         // types that got at least one response
	lastSE   atomic.Pointer[string]
}

func (s *stream) serveIstiod(ads discoveryv3.AggregatedDiscoveryServiceClient) error {
	st, err := ads.StreamAggregatedResources(s.f.ctx)
	if err != nil {
		return err
	}
	node := istiodNodeFor(s.nodeID)
	for _, t := range istiodConfigTypes {
		if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: t}); err != nil {
			return fmt.Errorf("subscribing to %s: %w", t, err)
		}
	}
	seen := map[string]map[string]bool{}
	answered := map[string]bool{}
	for {
		resp, err := st.Recv()
		now := time.Now()
		if err != nil {
			return ended(err)
		}
		s.responses.Add(1)
		typeURL := resp.GetTypeUrl()
		k := slices.Index(istiodConfigTypes[:], typeURL)
		if k < 0 {
			return fmt.Errorf("a response of type %q, which the stream did not ask for", typeURL)
		}
		s.istiod.byKind[k].Add(1)
		if seen[typeURL] == nil {
			seen[typeURL] = map[string]bool{}
		}
		// We never NACK, so a version received twice is a resend.
		if seen[typeURL][resp.GetVersionInfo()] {
			s.resends.Add(1)
		}
		seen[typeURL][resp.GetVersionInfo()] = true
		if typeURL == serviceEntryType {
			if err := s.observeServiceEntries(resp, now); err != nil {
				return fmt.Errorf("ServiceEntry response %s: %w", resp.GetVersionInfo(), err)
			}
		}
		if !answered[typeURL] {
			answered[typeURL] = true
			s.istiod.answered.Store(int64(len(answered)))
			if len(answered) == len(istiodConfigTypes) {
				s.markReady(now)
			}
		}
		ack := &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
		if err := st.Send(ack); err != nil {
			return fmt.Errorf("sending an ACK: %w", err)
		}
	}
}

// observeServiceEntries counts the benchmark ServiceEntries of a (full
// state) response and records the arrival of the measured write when the
// written service's ServiceEntry holds its address, with the size of the
// response. Only resources whose bytes contain the address are decoded.
func (s *stream) observeServiceEntries(resp *discoveryv3.DiscoveryResponse, now time.Time) error {
	held := 0
	for _, a := range resp.GetResources() {
		if s.f.cds[mcpName(a.GetValue())] {
			held++
		}
	}
	s.cdsClusters.Store(int64(held))
	v := resp.GetVersionInfo()
	s.istiod.lastSE.Store(&v)
	t := s.f.target.Load()
	if t == nil || t.arrived[s.idx].Load() != 0 {
		return nil
	}
	for _, a := range resp.GetResources() {
		if !bytes.Contains(a.GetValue(), []byte(t.addr)) {
			continue
		}
		ok, err := t.holdsEntry(a)
		if err != nil {
			return err
		}
		if ok {
			t.bytes[s.idx].Store(int64(proto.Size(resp)))
			t.arrive(s.idx, now)
			return nil
		}
	}
	return nil
}

// holdsEntry reports whether an MCP resource is the target's ServiceEntry
// with an endpoint at the target's address.
func (t *writeTarget) holdsEntry(a *anypb.Any) (bool, error) {
	var r mcpapi.Resource
	if err := a.UnmarshalTo(&r); err != nil {
		return false, fmt.Errorf("resource of type %s: %w", a.GetTypeUrl(), err)
	}
	if r.GetMetadata().GetName() != t.object {
		return false, nil
	}
	var se networking.ServiceEntry
	if err := r.GetBody().UnmarshalTo(&se); err != nil {
		return false, fmt.Errorf("body of %s (%s): %w", t.object, r.GetBody().GetTypeUrl(), err)
	}
	for _, ep := range se.GetEndpoints() {
		if ep.GetAddress() == t.addr {
			return true, nil
		}
	}
	return false, nil
}

// Fields of istio.mcp.v1alpha1.Resource and Metadata read by mcpName.
const (
	mcpMetadataField = 1
	mcpNameField     = 1
)

// mcpName is the metadata.name of an encoded MCP Resource, read without
// decoding the body.
func mcpName(b []byte) string {
	return subString(subBytes(b, mcpMetadataField), mcpNameField)
}

// subBytes is the last value of bytes field num of an encoded message.
func subBytes(b []byte, num protowire.Number) []byte {
	var out []byte
	for len(b) > 0 {
		n, typ, k := protowire.ConsumeTag(b)
		if k < 0 {
			return out
		}
		b = b[k:]
		if n == num && typ == protowire.BytesType {
			v, k := protowire.ConsumeBytes(b)
			if k < 0 {
				return out
			}
			out, b = v, b[k:]
			continue
		}
		k = protowire.ConsumeFieldValue(n, typ, b)
		if k < 0 {
			return out
		}
		b = b[k:]
	}
	return out
}

// describeIstiod is describe's line for an istiod-shaped stream.
func (s *stream) describeIstiod() string {
	last := "none"
	if v := s.istiod.lastSE.Load(); v != nil {
		last = *v
	}
	return fmt.Sprintf("%d/%d types answered, ServiceEntries for %d/%d services (%d ServiceEntry responses, last version %s)",
		s.istiod.answered.Load(), len(istiodConfigTypes), s.cdsClusters.Load(), s.cdsWant,
		s.istiod.byKind[slices.Index(istiodConfigTypes[:], serviceEntryType)].Load(), last)
}
