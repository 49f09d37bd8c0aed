package hub

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Limits bounds what xDS clients may make the hub hold. A zero field takes
// its default (the Default* constants).
type Limits struct {
	// MaxRequestBytes is the largest xDS request message accepted (gRPC
	// MaxRecvMsgSize); a larger one ends its stream with ResourceExhausted.
	MaxRequestBytes int
	// MaxStreamsPerConnection is the HTTP/2 MaxConcurrentStreams of each
	// client connection; streams beyond it wait for one to end.
	MaxStreamsPerConnection uint32
	// MaxStreams bounds the open xDS streams of the hub (all listeners);
	// more are refused with ResourceExhausted.
	MaxStreams int
	// MaxNodeMetadataBytes bounds node.metadata (marshalled); a larger one
	// ends its stream with InvalidArgument.
	MaxNodeMetadataBytes int
	// MaxResourceNames bounds the resource names one stream subscribes to
	// per type; more end the stream with InvalidArgument.
	MaxResourceNames int

	// debugRate and debugBurst pace the debug answers (TypeSyncz) to each
	// caller identity on the mTLS port (zero: debugPerCallerPerSecond,
	// debugPerCallerBurst; set by tests only).
	debugRate  rate.Limit
	debugBurst int
}

// Defaults of Limits. Requests of real clients are small: an ACK is a few
// hundred bytes, and the largest request is a SotW subscription listing
// every name (Envoy with 20,000 clusters asks for 20,000 EDS names, about
// 1.2 MB). istiod accepts 4 MiB, as grpc-go does by default.
const (
	DefaultMaxRequestBytes         = 4 << 20
	DefaultMaxStreamsPerConnection = 16
	DefaultMaxStreams              = 10000
	DefaultMaxNodeMetadataBytes    = 64 << 10
	DefaultMaxResourceNames        = 50000
)

// Pacing of debug answers to mTLS callers, per replica: each walks every
// stream, and any workload identity of our trust
// domain may ask. istioctl asks once per command; a dashboard polling every
// few seconds is far below these. A caller identity (member and namespace)
// gets debugPerCallerPerSecond; the callers of one member together
// debugPerMemberPerSecond, half of everyone's, so that a tenant with many
// namespaces cannot take the whole pace; all together debugPerSecond.
// Callers of Istio's root namespace (operators, who see every proxy) have
// their own pace only: no tenant can pace them out. The paces of at most
// debugCallers identities (and members) are remembered (the least recent
// is forgotten, starting afresh).
const (
	debugPerCallerPerSecond = 2
	debugPerCallerBurst     = 5
	debugPerMemberPerSecond = debugPerSecond / 2
	debugPerMemberBurst     = debugBurst / 2
	debugPerSecond          = 10
	debugBurst              = 20
	debugCallers            = 1024
)

// Fixed bounds, well above anything a real client sends.
const (
	// maxNodeIDBytes bounds node.id (Istio's are ~100 bytes).
	maxNodeIDBytes = 1 << 10
	// maxNodeOtherBytes bounds the rest of the node (Envoy lists every
	// extension it was built with in node.extensions: tens of KiB).
	maxNodeOtherBytes = 256 << 10
	// maxResourceNameBytes bounds one resource name: every name the hub
	// serves is shorter (a hostname is at most 253 bytes; a Kubernetes
	// Secret reference at most kubernetes:// + 63 + / + 253).
	maxResourceNameBytes = 512
	// maxNackDetailBytes bounds the NACK error_detail kept and shown.
	maxNackDetailBytes = 1 << 10
	// maxHeaderListBytes bounds a stream's gRPC headers (the largest real
	// one is a service-account token of a few KiB).
	maxHeaderListBytes = 64 << 10
)

func (l Limits) withDefaults() Limits {
	if l.MaxRequestBytes <= 0 {
		l.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if l.MaxStreamsPerConnection == 0 {
		l.MaxStreamsPerConnection = DefaultMaxStreamsPerConnection
	}
	if l.MaxStreams <= 0 {
		l.MaxStreams = DefaultMaxStreams
	}
	if l.MaxNodeMetadataBytes <= 0 {
		l.MaxNodeMetadataBytes = DefaultMaxNodeMetadataBytes
	}
	if l.MaxResourceNames <= 0 {
		l.MaxResourceNames = DefaultMaxResourceNames
	}
	if l.debugRate <= 0 {
		l.debugRate = debugPerCallerPerSecond
	}
	if l.debugBurst <= 0 {
		l.debugBurst = debugPerCallerBurst
	}
	return l
}

// checkNode refuses a node whose ID, metadata or other fields are larger
// than any real client's: the stream keeps its node for its whole life.
func (l Limits) checkNode(n *corev3.Node) error {
	if n == nil {
		return nil
	}
	if len(n.GetId()) > maxNodeIDBytes {
		return status.Errorf(codes.InvalidArgument, "node.id has %d bytes; at most %d are accepted", len(n.GetId()), maxNodeIDBytes)
	}
	meta := proto.Size(n.GetMetadata())
	if meta > l.MaxNodeMetadataBytes {
		return status.Errorf(codes.InvalidArgument, "node.metadata has %d bytes; at most %d are accepted", meta, l.MaxNodeMetadataBytes)
	}
	if other := proto.Size(n) - meta; other > maxNodeOtherBytes {
		return status.Errorf(codes.InvalidArgument, "the node (without its metadata) has %d bytes; at most %d are accepted", other, maxNodeOtherBytes)
	}
	return nil
}

// checkNames refuses a subscription of more names than the limit or a
// name no served resource can have.
func (l Limits) checkNames(typeURL string, count int, lists ...[]string) error {
	if count > l.MaxResourceNames {
		return status.Errorf(codes.InvalidArgument, "%d %s resource names on one stream; at most %d are accepted", count, typeLabel(typeURL), l.MaxResourceNames)
	}
	for _, names := range lists {
		for _, name := range names {
			if len(name) > maxResourceNameBytes {
				return status.Errorf(codes.InvalidArgument, "a %s resource name of %d bytes; at most %d are accepted", typeLabel(typeURL), len(name), maxResourceNameBytes)
			}
		}
	}
	return nil
}

// checkRequestType refuses a type URL the hub does not serve (debug types
// are served: TypeSyncz) before the request is recorded anywhere. An empty one is left to the stream's
// loop (it refuses it on ADS streams; per-type services fill in their own).
func checkRequestType(typeURL string) error {
	if typeURL == "" || isDebugType(typeURL) {
		return nil
	}
	return checkType(typeURL)
}

func errTooManyStreams(limit int) error {
	return status.Errorf(codes.ResourceExhausted, "the hub serves at most %d xDS streams; retry later (or another replica)", limit)
}
