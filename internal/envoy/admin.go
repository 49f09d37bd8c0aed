package envoy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	// The types config dumps hold (in Anys), beyond the ones bootstrap.go
	// and admin/v3 bring in: what the hub sends (hub/xdsgen).
	_ "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/path/match/uri_template/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/raw_buffer/v3"
)

// AdminAPI reads an Envoy's admin API: one Start ran (Process embeds it) or
// one another program runs, such as pilot-agent (NewAdminAPI).
type AdminAPI struct {
	url    string // base URL, http://127.0.0.1:port
	client *http.Client
	netns  string
}

// NewAdminAPI reads the admin API at base (http://host:port); netns, when
// set, is the named network namespace the Envoy runs in, which the reader
// dials into.
func NewAdminAPI(base, netns string) *AdminAPI {
	a := &AdminAPI{url: strings.TrimSuffix(base, "/"), netns: netns}
	a.client = &http.Client{Transport: &http.Transport{
		DialContext:       a.dialAdmin,
		DisableKeepAlives: netns != "", // each dial hops namespaces; keep it simple
	}}
	return a
}

// URL is the admin API's base URL, e.g. http://127.0.0.1:40123.
func (p *AdminAPI) URL() string { return p.url }

// Get returns the body of GET path (e.g. "/server_info") from the admin
// API, or an error if the answer is not 200.
func (p *AdminAPI) Get(ctx context.Context, path string) ([]byte, error) {
	status, body, err := p.do(ctx, http.MethodGet, path)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("envoy admin GET %s: %d %s", path, status, truncate(body, 512))
	}
	return body, nil
}

// do sends one request to the admin API and reads the whole answer.
func (p *AdminAPI) do(ctx context.Context, method, path string) (int, []byte, error) {
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	req, err := http.NewRequestWithContext(ctx, method, p.url+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("envoy admin %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, fmt.Errorf("envoy admin %s %s: reading the answer: %w", method, path, err)
	}
	return resp.StatusCode, body, nil
}

func truncate(b []byte, n int) string {
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// Stats returns the counters and gauges (not histograms, nor text readouts)
// whose names match the regular expression filter (all when ""), from
// /stats?format=json.
func (p *AdminAPI) Stats(ctx context.Context, filter string) (map[string]uint64, error) {
	path := "/stats?format=json"
	if filter != "" {
		path += "&filter=" + url.QueryEscape(filter)
	}
	body, err := p.Get(ctx, path)
	if err != nil {
		return nil, err
	}
	return ParseStats(body)
}

// ParseStats reads the counters and gauges of an admin
// /stats?format=json answer (histograms and text readouts left out).
func ParseStats(body []byte) (map[string]uint64, error) {
	var doc struct {
		Stats []struct {
			Name  string          `json:"name"`
			Value json.RawMessage `json:"value"`
		} `json:"stats"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("decoding envoy stats: %w", err)
	}
	out := make(map[string]uint64, len(doc.Stats))
	for _, s := range doc.Stats {
		if s.Name == "" { // the histograms entry
			continue
		}
		v, err := strconv.ParseUint(string(s.Value), 10, 64)
		if err != nil { // a text readout
			continue
		}
		out[s.Name] = v
	}
	return out, nil
}

// ClusterStatus is one cluster of /clusters.
type ClusterStatus struct {
	Name        string
	AddedViaAPI bool // from CDS, not static_resources
	Hosts       []HostStatus
}

// HostStatus is one host of a cluster.
type HostStatus struct {
	Address  string // host:port, or a pipe path
	Hostname string
	// Health is the health EDS gave the host, e.g. "HEALTHY", "UNHEALTHY",
	// "DRAINING", "DEGRADED" (corev3.HealthStatus's names).
	Health                     string
	FailedActiveHealthCheck    bool
	FailedOutlierCheck         bool
	FailedActiveDegradedCheck  bool
	PendingDynamicRemoval      bool
	PendingActiveHC            bool
	ExcludedViaImmediateHCFail bool
	ActiveHCTimeout            bool
	Priority                   uint32
	Weight                     uint32
	Region, Zone, SubZone      string
}

// Healthy reports whether Envoy would send traffic to the host: EDS says
// HEALTHY (or UNKNOWN, which Envoy treats as healthy) and no check failed.
func (h HostStatus) Healthy() bool {
	return (h.Health == corev3.HealthStatus_HEALTHY.String() || h.Health == corev3.HealthStatus_UNKNOWN.String()) &&
		!h.FailedActiveHealthCheck && !h.FailedOutlierCheck && !h.PendingDynamicRemoval &&
		!h.ExcludedViaImmediateHCFail && !h.ActiveHCTimeout
}

// Clusters returns every cluster Envoy has, with its hosts, from
// /clusters?format=json.
func (p *AdminAPI) Clusters(ctx context.Context) ([]ClusterStatus, error) {
	raw, err := p.ClustersProto(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]ClusterStatus, 0, len(raw.GetClusterStatuses()))
	for _, c := range raw.GetClusterStatuses() {
		cs := ClusterStatus{Name: c.GetName(), AddedViaAPI: c.GetAddedViaApi()}
		for _, h := range c.GetHostStatuses() {
			hs := h.GetHealthStatus()
			cs.Hosts = append(cs.Hosts, HostStatus{
				Address:                    addressString(h.GetAddress()),
				Hostname:                   h.GetHostname(),
				Health:                     hs.GetEdsHealthStatus().String(),
				FailedActiveHealthCheck:    hs.GetFailedActiveHealthCheck(),
				FailedOutlierCheck:         hs.GetFailedOutlierCheck(),
				FailedActiveDegradedCheck:  hs.GetFailedActiveDegradedCheck(),
				PendingDynamicRemoval:      hs.GetPendingDynamicRemoval(),
				PendingActiveHC:            hs.GetPendingActiveHc(),
				ExcludedViaImmediateHCFail: hs.GetExcludedViaImmediateHcFail(),
				ActiveHCTimeout:            hs.GetActiveHcTimeout(),
				Priority:                   h.GetPriority(),
				Weight:                     h.GetWeight(),
				Region:                     h.GetLocality().GetRegion(),
				Zone:                       h.GetLocality().GetZone(),
				SubZone:                    h.GetLocality().GetSubZone(),
			})
		}
		out = append(out, cs)
	}
	return out, nil
}

// ClustersProto returns /clusters?format=json as it is.
func (p *AdminAPI) ClustersProto(ctx context.Context) (*adminv3.Clusters, error) {
	body, err := p.Get(ctx, "/clusters?format=json")
	if err != nil {
		return nil, err
	}
	out := &adminv3.Clusters{}
	if err := unmarshal(body, out); err != nil {
		return nil, fmt.Errorf("decoding envoy /clusters: %w", err)
	}
	return out, nil
}

func addressString(a *corev3.Address) string {
	if sa := a.GetSocketAddress(); sa != nil {
		return net.JoinHostPort(sa.GetAddress(), strconv.FormatUint(uint64(sa.GetPortValue()), 10))
	}
	if pipe := a.GetPipe(); pipe != nil {
		return pipe.GetPath()
	}
	return a.String()
}

// ConfigDump returns /config_dump (with EDS's endpoints when includeEDS),
// decoded. Fields this module's go-control-plane does not know are dropped,
// and so is the content of an Any whose type it does not know (the Any keeps
// its type URL).
func (p *AdminAPI) ConfigDump(ctx context.Context, includeEDS bool) (*adminv3.ConfigDump, error) {
	path := "/config_dump"
	if includeEDS {
		path += "?include_eds"
	}
	body, err := p.Get(ctx, path)
	if err != nil {
		return nil, err
	}
	out := &adminv3.ConfigDump{}
	if err := unmarshal(body, out); err != nil {
		return nil, fmt.Errorf("decoding envoy %s: %w", path, err)
	}
	return out, nil
}

// ServerInfo returns /server_info (version, state, command line).
func (p *AdminAPI) ServerInfo(ctx context.Context) (*adminv3.ServerInfo, error) {
	body, err := p.Get(ctx, "/server_info")
	if err != nil {
		return nil, err
	}
	out := &adminv3.ServerInfo{}
	if err := unmarshal(body, out); err != nil {
		return nil, fmt.Errorf("decoding envoy /server_info: %w", err)
	}
	return out, nil
}

func unmarshal(b []byte, m proto.Message) error {
	return protojson.UnmarshalOptions{DiscardUnknown: true, Resolver: resolver{}}.Unmarshal(b, m)
}

// resolver is protoregistry.GlobalTypes, falling back, for a message type
// nobody registered, to an empty placeholder of that name (so that with
// DiscardUnknown an Any of it decodes, to no content, instead of failing
// the whole dump).
type resolver struct{}

var placeholders sync.Map // protoreflect.FullName → protoreflect.MessageType

func (resolver) FindMessageByName(name protoreflect.FullName) (protoreflect.MessageType, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(name)
	if err == protoregistry.NotFound {
		return placeholder(name)
	}
	return mt, err
}

func (r resolver) FindMessageByURL(u string) (protoreflect.MessageType, error) {
	name := u
	if i := strings.LastIndexByte(u, '/'); i >= 0 {
		name = u[i+1:]
	}
	return r.FindMessageByName(protoreflect.FullName(name))
}

func (resolver) FindExtensionByName(field protoreflect.FullName) (protoreflect.ExtensionType, error) {
	return protoregistry.GlobalTypes.FindExtensionByName(field)
}

func (resolver) FindExtensionByNumber(message protoreflect.FullName, field protoreflect.FieldNumber) (protoreflect.ExtensionType, error) {
	return protoregistry.GlobalTypes.FindExtensionByNumber(message, field)
}

func placeholder(name protoreflect.FullName) (protoreflect.MessageType, error) {
	if mt, ok := placeholders.Load(name); ok {
		return mt.(protoreflect.MessageType), nil
	}
	if !name.IsValid() {
		return nil, protoregistry.NotFound
	}
	file := &descriptorpb.FileDescriptorProto{
		Name:        proto.String("hub-envoy-placeholder/" + string(name) + ".proto"),
		Syntax:      proto.String("proto3"),
		Package:     proto.String(string(name.Parent())),
		MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String(string(name.Name()))}},
	}
	fd, err := protodesc.NewFile(file, new(protoregistry.Files))
	if err != nil {
		return nil, fmt.Errorf("placeholder for %s: %w", name, err)
	}
	mt, _ := placeholders.LoadOrStore(name, dynamicpb.NewMessageType(fd.Messages().Get(0)))
	return mt.(protoreflect.MessageType), nil
}
