package authz

// The building blocks of the RBAC policies BuildRBAC makes, ported from
// istio.io/istio (pilot/pkg/security/authz/matcher, the constructors of
// pilot/pkg/security/authz/model/{permission,principal,util}.go and the
// helpers they call) so that the protos come out as istiod's, field for
// field; and grpcRefusal, which says what grpc-go's RBAC refuses.

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rbacpb "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherpb "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const (
	// spiffeURIPrefix is Istio's spiffe.URIPrefix.
	spiffeURIPrefix = "spiffe://"
	// jwtFilterName and jwtFilterPayload are where Envoy's JWT filter puts
	// a verified token's claims (Istio's filters.EnvoyJwtFilterName and
	// EnvoyJwtFilterPayload).
	jwtFilterName    = "envoy.filters.http.jwt_authn"
	jwtFilterPayload = "payload"
	// matchOneTemplate and matchAnyTemplate are the path template operators
	// (Istio's security.MatchOneTemplate and MatchAnyTemplate).
	matchOneTemplate = "{*}"
	matchAnyTemplate = "{**}"
)

// containsPathTemplate is Istio's security.ContainsPathTemplate.
func containsPathTemplate(value string) bool {
	return strings.Contains(value, matchOneTemplate) || strings.Contains(value, matchAnyTemplate)
}

// stringMatcher is Istio's matcher.StringMatcher: "*" any non-empty
// string, "*x" suffix, "x*" prefix, else exact.
func stringMatcher(v string) *matcherpb.StringMatcher {
	return stringMatcherWithPrefix(v, "")
}

// stringOrMatcher is Istio's matcher.StringOrMatcher.
func stringOrMatcher(vs []string) *matcherpb.ValueMatcher {
	matchers := []*matcherpb.ValueMatcher{}
	for _, v := range vs {
		matchers = append(matchers, stringValueMatcher(v))
	}
	return orMatcher(matchers)
}

// stringValueMatcher is a value matcher of stringMatcher(v).
func stringValueMatcher(v string) *matcherpb.ValueMatcher {
	return &matcherpb.ValueMatcher{MatchPattern: &matcherpb.ValueMatcher_StringMatch{StringMatch: stringMatcher(v)}}
}

// orMatcher is Istio's matcher.OrMatcher: the one matcher itself, or an
// or_match of them.
func orMatcher(matchers []*matcherpb.ValueMatcher) *matcherpb.ValueMatcher {
	if len(matchers) == 1 {
		return matchers[0]
	}
	return &matcherpb.ValueMatcher{
		MatchPattern: &matcherpb.ValueMatcher_OrMatch{OrMatch: &matcherpb.OrMatcher{ValueMatchers: matchers}},
	}
}

func stringMatcherRegex(regex string) *matcherpb.StringMatcher {
	return &matcherpb.StringMatcher{
		MatchPattern: &matcherpb.StringMatcher_SafeRegex{SafeRegex: &matcherpb.RegexMatcher{Regex: regex}},
	}
}

func stringMatcherPrefix(prefix string, ignoreCase bool) *matcherpb.StringMatcher {
	return &matcherpb.StringMatcher{IgnoreCase: ignoreCase, MatchPattern: &matcherpb.StringMatcher_Prefix{Prefix: prefix}}
}

func stringMatcherSuffix(suffix string, ignoreCase bool) *matcherpb.StringMatcher {
	return &matcherpb.StringMatcher{IgnoreCase: ignoreCase, MatchPattern: &matcherpb.StringMatcher_Suffix{Suffix: suffix}}
}

func stringMatcherExact(exact string, ignoreCase bool) *matcherpb.StringMatcher {
	return &matcherpb.StringMatcher{IgnoreCase: ignoreCase, MatchPattern: &matcherpb.StringMatcher_Exact{Exact: exact}}
}

// stringMatcherWithPrefix is Istio's matcher.StringMatcherWithPrefix: v
// ("*", "*x", "x*" or exact) matched after prefix.
func stringMatcherWithPrefix(v, prefix string) *matcherpb.StringMatcher {
	switch {
	// "*" first, so that no empty prefix or suffix (which Envoy refuses) is made.
	case v == "*":
		return stringMatcherRegex(".+")
	case strings.HasPrefix(v, "*"):
		if prefix == "" {
			return stringMatcherSuffix(strings.TrimPrefix(v, "*"), false)
		}
		return stringMatcherRegex(prefix + ".*" + regexp.QuoteMeta(strings.TrimPrefix(v, "*")))
	case strings.HasSuffix(v, "*"):
		return stringMatcherPrefix(prefix+strings.TrimSuffix(v, "*"), false)
	default:
		return stringMatcherExact(prefix+v, false)
	}
}

// headerMatcher is Istio's matcher.HeaderMatcher: header k is present
// ("*"), or ends with, starts with or is v.
func headerMatcher(k, v string) *routepb.HeaderMatcher {
	return wildcardHeaderMatcher(k, v, false)
}

// hostMatcher is Istio's matcher.HostMatcher: headerMatcher, ignoring case.
func hostMatcher(k, v string) *routepb.HeaderMatcher {
	return wildcardHeaderMatcher(k, v, true)
}

func wildcardHeaderMatcher(k, v string, ignoreCase bool) *routepb.HeaderMatcher {
	var m *matcherpb.StringMatcher
	switch {
	case v == "*": // first, so that no empty prefix or suffix is made
		return &routepb.HeaderMatcher{Name: k, HeaderMatchSpecifier: &routepb.HeaderMatcher_PresentMatch{PresentMatch: true}}
	case strings.HasPrefix(v, "*"):
		m = stringMatcherSuffix(v[1:], ignoreCase)
	case strings.HasSuffix(v, "*"):
		m = stringMatcherPrefix(v[:len(v)-1], ignoreCase)
	default:
		m = stringMatcherExact(v, ignoreCase)
	}
	return &routepb.HeaderMatcher{Name: k, HeaderMatchSpecifier: &routepb.HeaderMatcher_StringMatch{StringMatch: m}}
}

// pathMatcher is Istio's matcher.PathMatcher.
func pathMatcher(path string) *matcherpb.PathMatcher {
	return &matcherpb.PathMatcher{Rule: &matcherpb.PathMatcher_Path{Path: stringMatcher(path)}}
}

// metadataValueMatcher is Istio's matcher.MetadataValueMatcher: the value
// at key of filter's dynamic metadata.
func metadataValueMatcher(filter, key string, m *matcherpb.ValueMatcher) *matcherpb.MetadataMatcher {
	return &matcherpb.MetadataMatcher{
		Filter: filter,
		Path:   []*matcherpb.MetadataMatcher_PathSegment{{Segment: &matcherpb.MetadataMatcher_PathSegment_Key{Key: key}}},
		Value:  m,
	}
}

// metadataListValueMatcher is Istio's matcher.MetadataListValueMatcher
// with useExtendedJwt true (the only way Istio's HTTP generators call it):
// the value at keys of filter's metadata is a list one of whose items
// matches value, or matches value itself.
func metadataListValueMatcher(filter string, keys []string, value *matcherpb.ValueMatcher) *matcherpb.MetadataMatcher {
	paths := make([]*matcherpb.MetadataMatcher_PathSegment, 0, len(keys))
	for _, k := range keys {
		paths = append(paths, &matcherpb.MetadataMatcher_PathSegment{Segment: &matcherpb.MetadataMatcher_PathSegment_Key{Key: k}})
	}
	list := &matcherpb.ListMatcher{MatchPattern: &matcherpb.ListMatcher_OneOf{OneOf: value}}
	return &matcherpb.MetadataMatcher{
		Filter: filter,
		Path:   paths,
		Value: &matcherpb.ValueMatcher{MatchPattern: &matcherpb.ValueMatcher_OrMatch{OrMatch: &matcherpb.OrMatcher{
			ValueMatchers: []*matcherpb.ValueMatcher{
				{MatchPattern: &matcherpb.ValueMatcher_ListMatch{ListMatch: list}},
				// Istio shares value between both branches; a copy marshals the same.
				proto.CloneOf(value),
			},
		}}},
	}
}

// metadataStringMatcherForJWTClaim is Istio's model.MetadataStringMatcherForJWTClaim.
func metadataStringMatcherForJWTClaim(claim string, m *matcherpb.StringMatcher) *matcherpb.MetadataMatcher {
	return &matcherpb.MetadataMatcher{
		Filter: jwtFilterName,
		Path: []*matcherpb.MetadataMatcher_PathSegment{
			{Segment: &matcherpb.MetadataMatcher_PathSegment_Key{Key: jwtFilterPayload}},
			{Segment: &matcherpb.MetadataMatcher_PathSegment_Key{Key: claim}},
		},
		Value: &matcherpb.ValueMatcher{MatchPattern: &matcherpb.ValueMatcher_StringMatch{StringMatch: m}},
	}
}

// metadataListValueMatcherForJWTClaims is Istio's model.MetadataListValueMatcherForJWTClaims.
func metadataListValueMatcherForJWTClaims(claims []string, value *matcherpb.ValueMatcher) *matcherpb.MetadataMatcher {
	return metadataListValueMatcher(jwtFilterName, append([]string{jwtFilterPayload}, claims...), value)
}

// The permission and principal constructors of Istio's model package.

func permissionAny() *rbacpb.Permission {
	return &rbacpb.Permission{Rule: &rbacpb.Permission_Any{Any: true}}
}

func permissionAnd(ps []*rbacpb.Permission) *rbacpb.Permission {
	return &rbacpb.Permission{Rule: &rbacpb.Permission_AndRules{AndRules: &rbacpb.Permission_Set{Rules: ps}}}
}

func permissionOr(ps []*rbacpb.Permission) *rbacpb.Permission {
	return &rbacpb.Permission{Rule: &rbacpb.Permission_OrRules{OrRules: &rbacpb.Permission_Set{Rules: ps}}}
}

func permissionNot(p *rbacpb.Permission) *rbacpb.Permission {
	return &rbacpb.Permission{Rule: &rbacpb.Permission_NotRule{NotRule: p}}
}

func permissionDestinationIP(cidr *corev3.CidrRange) *rbacpb.Permission {
	return &rbacpb.Permission{Rule: &rbacpb.Permission_DestinationIp{DestinationIp: cidr}}
}

func permissionDestinationPort(port uint32) *rbacpb.Permission {
	return &rbacpb.Permission{Rule: &rbacpb.Permission_DestinationPort{DestinationPort: port}}
}

func permissionRequestedServerName(name *matcherpb.StringMatcher) *rbacpb.Permission {
	return &rbacpb.Permission{Rule: &rbacpb.Permission_RequestedServerName{RequestedServerName: name}}
}

// permissionMetadata is a metadata permission, as istiod makes it (not
// sourced_metadata, which replaces it).
func permissionMetadata(m *matcherpb.MetadataMatcher) *rbacpb.Permission {
	//lint:ignore SA1019 istiod emits the deprecated field; the hub emits what istiod does
	return &rbacpb.Permission{Rule: &rbacpb.Permission_Metadata{Metadata: m}}
}

func permissionHeader(h *routepb.HeaderMatcher) *rbacpb.Permission {
	return &rbacpb.Permission{Rule: &rbacpb.Permission_Header{Header: h}}
}

func permissionPath(p *matcherpb.PathMatcher) *rbacpb.Permission {
	return &rbacpb.Permission{Rule: &rbacpb.Permission_UrlPath{UrlPath: p}}
}

func principalAny() *rbacpb.Principal {
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_Any{Any: true}}
}

func principalAnd(ps []*rbacpb.Principal) *rbacpb.Principal {
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_AndIds{AndIds: &rbacpb.Principal_Set{Ids: ps}}}
}

func principalOr(ps []*rbacpb.Principal) *rbacpb.Principal {
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_OrIds{OrIds: &rbacpb.Principal_Set{Ids: ps}}}
}

func principalNot(p *rbacpb.Principal) *rbacpb.Principal {
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_NotId{NotId: p}}
}

// principalAuthenticated is Istio's principalAuthenticated with
// useAuthenticated true, as grpcgen calls it: the peer certificate's
// identity matches name.
func principalAuthenticated(name *matcherpb.StringMatcher) *rbacpb.Principal {
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_Authenticated_{
		Authenticated: &rbacpb.Principal_Authenticated{PrincipalName: name},
	}}
}

func principalDirectRemoteIP(cidr *corev3.CidrRange) *rbacpb.Principal {
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_DirectRemoteIp{DirectRemoteIp: cidr}}
}

func principalRemoteIP(cidr *corev3.CidrRange) *rbacpb.Principal {
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_RemoteIp{RemoteIp: cidr}}
}

// principalMetadata is a metadata principal, as istiod makes it (not
// sourced_metadata, which replaces it).
func principalMetadata(m *matcherpb.MetadataMatcher) *rbacpb.Principal {
	//lint:ignore SA1019 istiod emits the deprecated field; the hub emits what istiod does
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_Metadata{Metadata: m}}
}

func principalHeader(h *routepb.HeaderMatcher) *rbacpb.Principal {
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_Header{Header: h}}
}

// addrStrToCidrRange is Istio's util.AddrStrToCidrRange: a CIDR, or an
// address as a /32 or /128.
func addrStrToCidrRange(addr string) (*corev3.CidrRange, error) {
	if addr == "" {
		return nil, errors.New("empty address")
	}
	var prefix netip.Prefix
	if strings.Contains(addr, "/") {
		p, err := netip.ParsePrefix(addr)
		if err != nil {
			return nil, err
		}
		prefix = p
	} else {
		ip, err := netip.ParseAddr(addr)
		if err != nil {
			return nil, err
		}
		prefix = netip.PrefixFrom(ip, ip.BitLen())
	}
	return &corev3.CidrRange{
		AddressPrefix: prefix.Addr().String(),
		PrefixLen:     &wrapperspb.UInt32Value{Value: uint32(prefix.Bits())},
	}, nil
}

// convertToPort is Istio's model.convertToPort.
func convertToPort(v string) (uint32, error) {
	p, err := strconv.ParseUint(v, 10, 32)
	if err != nil || p > 65535 {
		return 0, fmt.Errorf("invalid port %s: %v", v, err)
	}
	return uint32(p), nil
}

// extractNameInBrackets is Istio's model.extractNameInBrackets: "[name]" → "name".
func extractNameInBrackets(s string) (string, error) {
	if !strings.HasPrefix(s, "[") || !strings.HasSuffix(s, "]") {
		return "", fmt.Errorf("expecting format [<NAME>], but found %s", s)
	}
	return strings.TrimPrefix(strings.TrimSuffix(s, "]"), "["), nil
}

// extractNameInNestedBrackets is Istio's model.extractNameInNestedBrackets:
// "[a][b]" → ["a", "b"]; anything else is extractNameInBrackets's.
func extractNameInNestedBrackets(s string) ([]string, error) {
	var claims []string
	for begin := 0; begin < len(s); {
		end := closingBracket(s, begin)
		if end == -1 {
			name, err := extractNameInBrackets(s)
			if err != nil {
				return nil, err
			}
			return []string{name}, nil
		}
		claims = append(claims, s[begin+1:end])
		begin = end + 1
	}
	return claims, nil
}

// closingBracket is the index of the "]" closing the "[" at begin, or -1
// when there is none (or another "[" comes first).
func closingBracket(s string, begin int) int {
	if begin >= len(s) || s[begin] != '[' {
		return -1
	}
	for i := begin + 1; i < len(s); i++ {
		switch s[i] {
		case '[':
			return -1
		case ']':
			return i
		}
	}
	return -1
}

// What grpc-go refuses. gRPC's RBAC HTTP filter (grpc-go 1.85) fails the
// whole filter config, and with it the Listener (NACKed: the server stops
// serving, or keeps its previous config), on any of these. The functions
// below mirror, for one rbacpb.Policy:
//   - parseConfig and normalizeHeaderMatcher in
//     google.golang.org/grpc@v1.85.0/internal/xds/httpfilter/rbac/rbac.go
//     (condition or checked_condition set; a header matcher, anywhere in
//     the tree, on ":scheme" or a "grpc-" header, case-insensitively);
//   - newPolicyMatcher, matchersFromPermissions, matchersFromPrincipals,
//     newHeaderMatcher, newURLPathMatcher, newRemoteIPMatcher,
//     newLocalIPMatcher, newRequestedServerNameMatcher and
//     newAuthenticatedMatcher in internal/xds/rbac/matchers.go (any
//     permission or principal kind not listed there, e.g. uri_template or
//     filter_state; an unparsable CIDR; a bad string matcher);
//   - StringMatcherFromProto and CompileSafeRegex in
//     internal/xds/matcher/string_matcher.go (no pattern; an empty prefix,
//     suffix or contains; a regex Go's regexp refuses).
// grpc-go accepts metadata matchers (and never matches them, unless
// inverted) and requested_server_name (matched against "").

// grpcRefusal is why grpc-go 1.85 would refuse p, or nil.
func grpcRefusal(p *rbacpb.Policy) error {
	if p.GetCondition() != nil || p.GetCheckedCondition() != nil {
		return errors.New("condition and checked_condition are not supported")
	}
	for _, perm := range p.GetPermissions() {
		if err := grpcPermissionRefusal(perm); err != nil {
			return err
		}
	}
	for _, princ := range p.GetPrincipals() {
		if err := grpcPrincipalRefusal(princ); err != nil {
			return err
		}
	}
	return nil
}

func grpcPermissionRefusal(p *rbacpb.Permission) error {
	switch r := p.GetRule().(type) {
	case *rbacpb.Permission_AndRules:
		return grpcPermissionsRefusal(r.AndRules.GetRules())
	case *rbacpb.Permission_OrRules:
		return grpcPermissionsRefusal(r.OrRules.GetRules())
	case *rbacpb.Permission_NotRule:
		return grpcPermissionRefusal(r.NotRule)
	case *rbacpb.Permission_Any, *rbacpb.Permission_DestinationPort, *rbacpb.Permission_Metadata:
		return nil
	case *rbacpb.Permission_Header:
		return grpcHeaderRefusal(r.Header)
	case *rbacpb.Permission_UrlPath:
		return grpcStringMatcherRefusal(r.UrlPath.GetPath())
	case *rbacpb.Permission_DestinationIp:
		return grpcCIDRRefusal(r.DestinationIp)
	case *rbacpb.Permission_RequestedServerName:
		return grpcStringMatcherRefusal(r.RequestedServerName)
	default:
		return fmt.Errorf("unsupported permission rule type: %T", r)
	}
}

func grpcPermissionsRefusal(ps []*rbacpb.Permission) error {
	for _, p := range ps {
		if err := grpcPermissionRefusal(p); err != nil {
			return err
		}
	}
	return nil
}

func grpcPrincipalRefusal(p *rbacpb.Principal) error {
	switch id := p.GetIdentifier().(type) {
	case *rbacpb.Principal_AndIds:
		return grpcPrincipalsRefusal(id.AndIds.GetIds())
	case *rbacpb.Principal_OrIds:
		return grpcPrincipalsRefusal(id.OrIds.GetIds())
	case *rbacpb.Principal_NotId:
		return grpcPrincipalRefusal(id.NotId)
	case *rbacpb.Principal_Any, *rbacpb.Principal_Metadata:
		return nil
	case *rbacpb.Principal_Authenticated_:
		if id.Authenticated.GetPrincipalName() == nil {
			return nil
		}
		return grpcStringMatcherRefusal(id.Authenticated.GetPrincipalName())
	case *rbacpb.Principal_DirectRemoteIp:
		return grpcCIDRRefusal(id.DirectRemoteIp)
	case *rbacpb.Principal_SourceIp:
		//lint:ignore SA1019 grpc-go parses the deprecated field
		return grpcCIDRRefusal(id.SourceIp)
	case *rbacpb.Principal_RemoteIp:
		return grpcCIDRRefusal(id.RemoteIp)
	case *rbacpb.Principal_Header:
		return grpcHeaderRefusal(id.Header)
	case *rbacpb.Principal_UrlPath:
		return grpcStringMatcherRefusal(id.UrlPath.GetPath())
	default:
		return fmt.Errorf("unsupported principal identifier type: %T", id)
	}
}

func grpcPrincipalsRefusal(ps []*rbacpb.Principal) error {
	for _, p := range ps {
		if err := grpcPrincipalRefusal(p); err != nil {
			return err
		}
	}
	return nil
}

// grpcHeaderNameRefusal is why grpc-go refuses a header matcher on name
// (gRFC A41: ":scheme" and "grpc-" headers, whatever their case), or nil.
func grpcHeaderNameRefusal(name string) error {
	switch lower := strings.ToLower(name); {
	case lower == ":scheme":
		return fmt.Errorf("gRPC's RBAC refuses header matchers on %q (gRFC A41)", ":scheme")
	case strings.HasPrefix(lower, "grpc-"):
		return fmt.Errorf("gRPC's RBAC refuses header matchers on %q headers (gRFC A41)", "grpc-")
	}
	return nil
}

func grpcHeaderRefusal(h *routepb.HeaderMatcher) error {
	if err := grpcHeaderNameRefusal(h.GetName()); err != nil {
		return err
	}
	switch s := h.GetHeaderMatchSpecifier().(type) {
	case *routepb.HeaderMatcher_ExactMatch, *routepb.HeaderMatcher_RangeMatch, *routepb.HeaderMatcher_PresentMatch,
		*routepb.HeaderMatcher_PrefixMatch, *routepb.HeaderMatcher_SuffixMatch, *routepb.HeaderMatcher_ContainsMatch:
		return nil
	case *routepb.HeaderMatcher_SafeRegexMatch:
		//lint:ignore SA1019 grpc-go parses the deprecated field
		return grpcRegexRefusal(s.SafeRegexMatch.GetRegex())
	case *routepb.HeaderMatcher_StringMatch:
		return grpcStringMatcherRefusal(s.StringMatch)
	default:
		return errors.New("unknown header matcher type")
	}
}

func grpcStringMatcherRefusal(m *matcherpb.StringMatcher) error {
	switch p := m.GetMatchPattern().(type) {
	case *matcherpb.StringMatcher_Exact:
		return nil
	case *matcherpb.StringMatcher_Prefix:
		return grpcNonEmpty("prefix", p.Prefix)
	case *matcherpb.StringMatcher_Suffix:
		return grpcNonEmpty("suffix", p.Suffix)
	case *matcherpb.StringMatcher_Contains:
		return grpcNonEmpty("contains", p.Contains)
	case *matcherpb.StringMatcher_SafeRegex:
		return grpcRegexRefusal(p.SafeRegex.GetRegex())
	default:
		return fmt.Errorf("unrecognized string matcher: %v", m)
	}
}

func grpcNonEmpty(kind, s string) error {
	if s == "" {
		return fmt.Errorf("empty %s is not allowed in StringMatcher", kind)
	}
	return nil
}

// grpcRegexRefusal is CompileSafeRegex's error: grpc-go compiles the
// regex, then "^(?:regex)$", with Go's regexp.
func grpcRegexRefusal(regex string) error {
	if _, err := regexp.Compile(regex); err != nil {
		return fmt.Errorf("safe_regex matcher %q is invalid: %w", regex, err)
	}
	if _, err := regexp.Compile("^(?:" + regex + ")$"); err != nil {
		return fmt.Errorf("safe_regex matcher %q is invalid: %w", regex, err)
	}
	return nil
}

func grpcCIDRRefusal(c *corev3.CidrRange) error {
	s := fmt.Sprintf("%s/%d", c.GetAddressPrefix(), c.GetPrefixLen().GetValue())
	if _, err := netip.ParsePrefix(s); err != nil {
		return fmt.Errorf("CIDR range %q: %w", s, err)
	}
	return nil
}
