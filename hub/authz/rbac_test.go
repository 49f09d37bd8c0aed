package authz

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerpb "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacpb "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rbachttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	routerpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/path/match/uri_template/v3" // istiod's uri_template permissions, in YAML
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/xds"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	securityv1beta1 "istio.io/api/security/v1beta1"
	"sigs.k8s.io/yaml"
)

// protoFromYAML fills m from YAML (protojson's field names).
func protoFromYAML(t *testing.T, y string, m proto.Message) {
	t.Helper()
	j, err := yaml.YAMLToJSON([]byte(y))
	if err != nil {
		t.Fatalf("YAML: %v", err)
	}
	if err := protojson.Unmarshal(j, m); err != nil {
		t.Fatalf("%T from YAML: %v\n%s", m, err, y)
	}
}

// wantRBAC is an expected RBAC in YAML; nil for "".
func wantRBAC(t *testing.T, action rbacpb.RBAC_Action, y string) *rbacpb.RBAC {
	t.Helper()
	if y == "" {
		return nil
	}
	r := &rbacpb.RBAC{}
	protoFromYAML(t, y, r)
	r.Action = action
	return r
}

// checkRBAC fails t unless got is want (proto.Equal).
func checkRBAC(t *testing.T, want, got *rbacpb.RBAC) {
	t.Helper()
	if !proto.Equal(want, got) {
		t.Errorf("RBAC:\n got %s\nwant %s", prototext.Format(got), prototext.Format(want))
	}
}

// istioManifests reads "---"-separated AuthorizationPolicy istioManifests, as in
// Istio's builder testdata, keeping those of action (ALLOW or DENY).
func istioManifests(t *testing.T, text string, action rbacpb.RBAC_Action) []Policy {
	t.Helper()
	var out []Policy
	for _, doc := range strings.Split(text, "\n---") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var m struct {
			Metadata struct{ Name, Namespace string }
			Spec     json.RawMessage
		}
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("manifest: %v", err)
		}
		spec := &securityv1beta1.AuthorizationPolicy{}
		if err := protojson.Unmarshal(m.Spec, spec); err != nil {
			t.Fatalf("spec: %v", err)
		}
		if (spec.GetAction() == securityv1beta1.AuthorizationPolicy_DENY) == (action == rbacpb.RBAC_DENY) {
			out = append(out, Policy{Namespace: m.Metadata.Namespace, Name: m.Metadata.Name, Spec: spec})
		}
	}
	return out
}

// specYAML is an AuthorizationPolicy spec from YAML.
func specYAML(t *testing.T, y string) *securityv1beta1.AuthorizationPolicy {
	t.Helper()
	s := &securityv1beta1.AuthorizationPolicy{}
	protoFromYAML(t, y, s)
	return s
}

// checkProduced checks what grpc-go needs of a produced RBAC: it and the
// HTTP filter config carrying it pass their validation, and grpc-go's
// parser would take it (grpcRBACRefusal).
func checkProduced(t *testing.T, r *rbacpb.RBAC) {
	t.Helper()
	if r == nil {
		return
	}
	if err := (&rbachttp.RBAC{Rules: r}).ValidateAll(); err != nil {
		t.Errorf("produced RBAC fails validation: %v", err)
	}
	if err := grpcRBACRefusal(r); err != nil {
		t.Errorf("grpc-go would refuse the produced RBAC: %v", err)
	}
}

// grpcRBACRefusal is why grpc-go 1.85 would refuse an ALLOW or DENY RBAC
// as an RBAC HTTP filter's rules, or nil: grpcRefusal for each policy
// (parseConfig in internal/xds/httpfilter/rbac/rbac.go, newPolicyMatcher
// in internal/xds/rbac/matchers.go), and an action other than ALLOW and
// DENY (newEngine in internal/xds/rbac/rbac_engine.go; parseConfig
// ignores LOG, which BuildRBAC's callers do not use). Audit logging
// options, which BuildRBAC never sets, are refused here outright.
func grpcRBACRefusal(r *rbacpb.RBAC) error {
	if a := r.GetAction(); a != rbacpb.RBAC_ALLOW && a != rbacpb.RBAC_DENY {
		return fmt.Errorf("unsupported action %s", a)
	}
	if r.GetAuditLoggingOptions() != nil {
		return fmt.Errorf("audit logging options are not mirrored")
	}
	for name, p := range r.GetPolicies() {
		if err := grpcRefusal(p); err != nil {
			return fmt.Errorf("policy %q: %w", name, err)
		}
	}
	return nil
}

// istioCase is one of Istio's builder tests
// (pilot/pkg/security/authz/builder/testdata/http/<name>-in.yaml and
// <out>): the policies of action in, and the rules of the RBAC filter
// istiod's builder makes of them (useAuthenticated, as grpcgen), names
// "ns[<ns>]-policy[<name>]-rule[<i>]" written as grpcgen writes them,
// "<ns>-<name>-<i>". Istio's builder test generates them with
// MigrateTrustDomain(td) (a zero bundle leaves these principals as they
// are, as grpcgen does).
type istioCase struct {
	name, out string
	action    rbacpb.RBAC_Action
	td        TrustDomainBundle
}

// input is the case's policies: testdata/istio/<name>-in.yaml, as in
// Istio's builder testdata.
func (tc istioCase) input(t *testing.T) string { return readTestdata(t, tc.name+"-in.yaml") }

// want is the RBAC istiod's builder makes of them: testdata/istio/<out>.
func (tc istioCase) want(t *testing.T) string { return readTestdata(t, tc.out) }

// readTestdata reads one of Istio's builder test files, kept in
// testdata/istio.
func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "istio", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestBuildRBACAsIstio: Istio's own expectations, as protos.
func TestBuildRBACAsIstio(t *testing.T) {
	for _, tc := range istioCases {
		t.Run(tc.out, func(t *testing.T) {
			got, problems := BuildRBAC(tc.action, istioManifests(t, tc.input(t), tc.action), tc.td)
			checkRBAC(t, wantRBAC(t, tc.action, tc.want(t)), got)
			for _, p := range problems {
				if !strings.Contains(p.Message, "kept as istiod emits it") {
					t.Errorf("problem %+v: only caveats expected", p)
				}
			}
			checkProduced(t, got)
		})
	}
}

// deviationCase is a rule set where the hub departs from istiod, or
// reports something, and what it builds.
type deviationCase struct {
	name     string
	action   rbacpb.RBAC_Action
	td       TrustDomainBundle
	policies func(t *testing.T) []Policy
	want     string // the RBAC in YAML, without its action; "" for nil
	problems []Problem
}

// onePolicy is a policy foo/p of spec YAML.
func onePolicy(y string) func(t *testing.T) []Policy {
	return func(t *testing.T) []Policy {
		return []Policy{{Namespace: "foo", Name: "p", Spec: specYAML(t, y)}}
	}
}

func deviationCases() []deviationCase {
	return []deviationCase{
		{
			name:   "path template, ALLOW: the rule is not applied",
			action: rbacpb.RBAC_ALLOW,
			policies: onePolicy(`
rules:
- to: [{operation: {paths: ["/a", "/b/{*}"]}}]
- to: [{operation: {paths: ["/c"]}}]
`),
			want: `
policies:
  foo-p-1:
    permissions: [{andRules: {rules: [{orRules: {rules: [{urlPath: {path: {exact: /c}}}]}}]}}]
    principals: [{andIds: {ids: [{any: true}]}}]
`,
			problems: []Problem{{AuthorizationPolicyKind, "foo/p", 0, `path "/b/{*}": path templates are not supported by gRPC's RBAC; the rule is not applied (ALLOW)`}},
		},
		{
			name:   "path template, DENY: the rule matches any path",
			action: rbacpb.RBAC_DENY,
			policies: onePolicy(`
rules:
- from: [{source: {principals: ["cluster.local/ns/a/sa/b"]}}]
  to: [{operation: {methods: ["GET"], paths: ["/a", "/b/{**}"]}}]
`),
			want: `
policies:
  foo-p-0:
    permissions:
    - andRules:
        rules:
        - orRules: {rules: [{header: {name: ":method", stringMatch: {exact: GET}}}]}
        - any: true
    principals:
    - andIds:
        ids:
        - orIds: {ids: [{authenticated: {principalName: {exact: "spiffe://cluster.local/ns/a/sa/b"}}}]}
`,
			problems: []Problem{{AuthorizationPolicyKind, "foo/p", 0, `path "/b/{**}": path templates are not supported by gRPC's RBAC; the rule matches any path instead (DENY)`}},
		},
		{
			name:   "path template in notPaths, DENY: the rule matches any path",
			action: rbacpb.RBAC_DENY,
			policies: onePolicy(`
rules:
- to: [{operation: {notPaths: ["/ok", "/x/{*}"], ports: ["8080"]}}]
`),
			want: `
policies:
  foo-p-0:
    permissions: [{andRules: {rules: [{any: true}, {orRules: {rules: [{destinationPort: 8080}]}}]}}]
    principals: [{andIds: {ids: [{any: true}]}}]
`,
			problems: []Problem{{AuthorizationPolicyKind, "foo/p", 0, `not path "/x/{*}": path templates are not supported by gRPC's RBAC; the rule matches any path instead (DENY)`}},
		},
		{
			name:   "grpc- header, ALLOW: the rule is not applied",
			action: rbacpb.RBAC_ALLOW,
			policies: onePolicy(`
rules:
- when: [{key: "request.headers[Grpc-Timeout]", values: ["1S"]}]
`),
			problems: []Problem{{AuthorizationPolicyKind, "foo/p", 0, `request.headers[Grpc-Timeout] "1S": gRPC's RBAC refuses header matchers on "grpc-" headers (gRFC A41); the rule is not applied (ALLOW)`}},
		},
		{
			name:   ":scheme header, DENY: the condition matches anything",
			action: rbacpb.RBAC_DENY,
			policies: onePolicy(`
rules:
- when:
  - {key: "request.headers[:scheme]", notValues: ["https"]}
  - {key: "request.headers[x-user]", values: ["bob"]}
`),
			want: `
policies:
  foo-p-0:
    permissions: [{andRules: {rules: [{any: true}]}}]
    principals:
    - andIds:
        ids:
        - any: true
        - orIds: {ids: [{header: {name: x-user, stringMatch: {exact: bob}}}]}
`,
			problems: []Problem{{AuthorizationPolicyKind, "foo/p", 0, `not request.headers[:scheme] "https": gRPC's RBAC refuses header matchers on ":scheme" (gRFC A41); the rule matches any request.headers[:scheme] instead (DENY)`}},
		},
		{
			name:   "malformed value, ALLOW: the rule is not applied, as in istiod",
			action: rbacpb.RBAC_ALLOW,
			policies: onePolicy(`
rules:
- from: [{source: {ipBlocks: ["10.0.0.0/8", "not-an-ip"]}}]
`),
			problems: []Problem{{AuthorizationPolicyKind, "foo/p", 0, `source.ip "not-an-ip": ParseAddr("not-an-ip"): unable to parse IP; the rule is not applied, as in istiod (ALLOW)`}},
		},
		{
			name:   "malformed value, DENY: the value is ignored, as in istiod",
			action: rbacpb.RBAC_DENY,
			policies: onePolicy(`
rules:
- from: [{source: {ipBlocks: ["10.0.0.0/8", "not-an-ip"]}}]
`),
			want: `
policies:
  foo-p-0:
    permissions: [{andRules: {rules: [{any: true}]}}]
    principals: [{andIds: {ids: [{orIds: {ids: [{directRemoteIp: {addressPrefix: 10.0.0.0, prefixLen: 8}}]}}]}}]
`,
			problems: []Problem{{AuthorizationPolicyKind, "foo/p", 0, `source.ip "not-an-ip": ParseAddr("not-an-ip"): unable to parse IP; the value is ignored, as in istiod (DENY)`}},
		},
		{
			name:   "unknown when key: the rule is skipped, as in istiod",
			action: rbacpb.RBAC_DENY,
			policies: onePolicy(`
rules:
- when: [{key: "request.regex.headers[x]", values: ["a"]}]
- from: [{source: {principals: ["x"]}}]
`),
			want: `
policies:
  foo-p-1:
    permissions: [{andRules: {rules: [{any: true}]}}]
    principals: [{andIds: {ids: [{orIds: {ids: [{authenticated: {principalName: {exact: "spiffe://x"}}}]}}]}}]
`,
			problems: []Problem{{AuthorizationPolicyKind, "foo/p", 0, `invalid rule: unknown attribute request.regex.headers[x]; it is skipped, as in istiod`}},
		},
		{
			name:   "what gRPC accepts but does not evaluate as Envoy: kept, reported",
			action: rbacpb.RBAC_ALLOW,
			policies: onePolicy(`
rules:
- from: [{source: {requestPrincipals: ["https://issuer/sub"], remoteIpBlocks: ["10.0.0.0/8"]}}]
  when:
  - {key: "request.auth.claims[groups]", values: ["admin"]}
  - {key: connection.sni, values: [a.example.com]}
  - {key: "experimental.envoy.filters.http.foo[bar]", values: [baz]}
`),
			want: `
policies:
  foo-p-0:
    permissions:
    - andRules:
        rules:
        - orRules: {rules: [{requestedServerName: {exact: a.example.com}}]}
        - metadata: {filter: envoy.filters.http.foo, path: [{key: bar}], value: {stringMatch: {exact: baz}}}
    principals:
    - andIds:
        ids:
        - andIds:
            ids:
            - metadata: {filter: envoy.filters.http.jwt_authn, path: [{key: payload}, {key: iss}], value: {stringMatch: {exact: "https://issuer"}}}
            - metadata: {filter: envoy.filters.http.jwt_authn, path: [{key: payload}, {key: sub}], value: {stringMatch: {exact: sub}}}
        - orIds: {ids: [{remoteIp: {addressPrefix: 10.0.0.0, prefixLen: 8}}]}
        - metadata:
            filter: envoy.filters.http.jwt_authn
            path: [{key: payload}, {key: groups}]
            value: {orMatch: {valueMatchers: [{listMatch: {oneOf: {stringMatch: {exact: admin}}}}, {stringMatch: {exact: admin}}]}}
`,
			problems: []Problem{
				{AuthorizationPolicyKind, "foo/p", 0, `connection.sni: gRPC's RBAC matches it against an empty server name; kept as istiod emits it (ALLOW)`},
				{AuthorizationPolicyKind, "foo/p", 0, `experimental.envoy.filters.http.foo[bar]: gRPC's RBAC never matches filter metadata (a negated one always matches); kept as istiod emits it (ALLOW)`},
				{AuthorizationPolicyKind, "foo/p", 0, `request.auth.principal: proxyless gRPC servers do not authenticate JWTs and gRPC's RBAC never matches metadata (a negated one always matches); kept as istiod emits it (ALLOW)`},
				{AuthorizationPolicyKind, "foo/p", 0, `remote.ip: gRPC's RBAC matches it against the direct peer address (no X-Forwarded-For or PROXY protocol); kept as istiod emits it (ALLOW)`},
				{AuthorizationPolicyKind, "foo/p", 0, `request.auth.claims[groups]: proxyless gRPC servers do not authenticate JWTs and gRPC's RBAC never matches metadata (a negated one always matches); kept as istiod emits it (ALLOW)`},
			},
		},
		{
			name:   "no rules: no policy",
			action: rbacpb.RBAC_ALLOW,
			policies: func(t *testing.T) []Policy {
				return []Policy{{Namespace: "foo", Name: "empty", Spec: specYAML(t, `{rules: []}`)}, {Namespace: "foo", Name: "nil"}}
			},
		},
		{
			name:   "a null rule is skipped, as istiod's sidecar builder does",
			action: rbacpb.RBAC_ALLOW,
			policies: func(t *testing.T) []Policy {
				return []Policy{{Namespace: "foo", Name: "p", Spec: &securityv1beta1.AuthorizationPolicy{Rules: []*securityv1beta1.Rule{nil, {}}}}}
			},
			want: `
policies:
  foo-p-1:
    permissions: [{andRules: {rules: [{any: true}]}}]
    principals: [{andIds: {ids: [{any: true}]}}]
`,
			problems: []Problem{{AuthorizationPolicyKind, "foo/p", 0, `the rule is null; it is skipped, as istiod's sidecar builder does`}},
		},
		{
			name:   "a later rule of the same name replaces an earlier one, as in istiod",
			action: rbacpb.RBAC_ALLOW,
			policies: func(t *testing.T) []Policy {
				return []Policy{
					{Namespace: "a-b", Name: "c", Spec: specYAML(t, `{rules: [{}]}`)},
					{Namespace: "a", Name: "b-c", Spec: specYAML(t, `{rules: [{from: [{source: {principals: [x]}}]}]}`)},
				}
			},
			want: `
policies:
  a-b-c-0:
    permissions: [{andRules: {rules: [{any: true}]}}]
    principals: [{andIds: {ids: [{orIds: {ids: [{authenticated: {principalName: {exact: "spiffe://x"}}}]}}]}}]
`,
			problems: []Problem{{AuthorizationPolicyKind, "a/b-c", 0, `RBAC policy name "a-b-c-0" is also an earlier rule's; this rule replaces it, as in istiod`}},
		},
		{
			name:   "no trust domain bundle: principals as written, as grpcgen",
			action: rbacpb.RBAC_ALLOW,
			policies: onePolicy(`
rules:
- from: [{source: {principals: ["cluster.local/ns/a/sa/b"], trustDomains: ["cluster.local"]}}]
`),
			want: `
policies:
  foo-p-0:
    permissions: [{andRules: {rules: [{any: true}]}}]
    principals:
    - andIds:
        ids:
        - orIds: {ids: [{authenticated: {principalName: {exact: "spiffe://cluster.local/ns/a/sa/b"}}}]}
        - orIds: {ids: [{authenticated: {principalName: {prefix: "spiffe://cluster.local/"}}}]}
`,
		},
		{
			// Istio's Model shares a when condition's rule between the
			// principals of each from, and MigrateTrustDomain maps it once
			// per principal: twice here.
			name:   "trust domain bundle: a when principal mapped once per from, as in Istio",
			action: rbacpb.RBAC_ALLOW,
			td:     TrustDomainBundle{TrustDomains: []string{"td1", "cluster.local"}},
			policies: onePolicy(`
rules:
- from: [{source: {namespaces: [a]}}, {source: {namespaces: [b]}}]
  when: [{key: source.principal, values: ["cluster.local/ns/x/sa/y"]}]
`),
			want: `
policies:
  foo-p-0:
    permissions: [{andRules: {rules: [{any: true}]}}]
    principals:
    - andIds:
        ids:
        - orIds: {ids: [{authenticated: {principalName: {safeRegex: {regex: ".*/ns/a/.*"}}}}]}
        - orIds:
            ids:
            - authenticated: {principalName: {exact: "spiffe://td1/ns/x/sa/y"}}
            - authenticated: {principalName: {exact: "spiffe://cluster.local/ns/x/sa/y"}}
            - authenticated: {principalName: {exact: "spiffe://td1/ns/x/sa/y"}}
            - authenticated: {principalName: {exact: "spiffe://cluster.local/ns/x/sa/y"}}
    - andIds:
        ids:
        - orIds: {ids: [{authenticated: {principalName: {safeRegex: {regex: ".*/ns/b/.*"}}}}]}
        - orIds:
            ids:
            - authenticated: {principalName: {exact: "spiffe://td1/ns/x/sa/y"}}
            - authenticated: {principalName: {exact: "spiffe://cluster.local/ns/x/sa/y"}}
            - authenticated: {principalName: {exact: "spiffe://td1/ns/x/sa/y"}}
            - authenticated: {principalName: {exact: "spiffe://cluster.local/ns/x/sa/y"}}
`,
		},
	}
}

// TestBuildRBACDeviations: where the hub departs from istiod, and what
// it reports.
func TestBuildRBACDeviations(t *testing.T) {
	for _, tc := range deviationCases() {
		t.Run(tc.name, func(t *testing.T) {
			got, problems := BuildRBAC(tc.action, tc.policies(t), tc.td)
			checkRBAC(t, wantRBAC(t, tc.action, tc.want), got)
			if !slices.Equal(tc.problems, problems) {
				t.Errorf("problems:\n got %+v\nwant %+v", problems, tc.problems)
			}
			checkProduced(t, got)
		})
	}
}

// TestBuildRBACInvalidPolicy: a rule whose RBAC policy would fail its own
// validation (here an empty header name, which Istio's webhook refuses
// but istiod would emit) is not applied (ALLOW) or matches every request
// (DENY).
func TestBuildRBACInvalidPolicy(t *testing.T) {
	p := []Policy{{Namespace: "foo", Name: "p", Spec: specYAML(t, `{rules: [{when: [{key: "request.headers[]", values: [x]}]}]}`)}}
	const prefix = "the rule's RBAC policy would be invalid: invalid Policy.Principals[0]: "
	got, problems := BuildRBAC(rbacpb.RBAC_ALLOW, p, TrustDomainBundle{})
	if got != nil || len(problems) != 1 || !strings.HasPrefix(problems[0].Message, prefix) || !strings.HasSuffix(problems[0].Message, "; the rule is not applied (ALLOW)") {
		t.Errorf("ALLOW: got %v, %v; want nil and one problem", got, problems)
	}
	got, problems = BuildRBAC(rbacpb.RBAC_DENY, p, TrustDomainBundle{})
	want := wantRBAC(t, rbacpb.RBAC_DENY, `{policies: {foo-p-0: {permissions: [{any: true}], principals: [{any: true}]}}}`)
	if !proto.Equal(got, want) || len(problems) != 1 || !strings.HasPrefix(problems[0].Message, prefix) || !strings.HasSuffix(problems[0].Message, "; the rule matches every request instead (DENY)") {
		t.Errorf("DENY: got %v, %v; want a policy matching everything and one problem", got, problems)
	}
}

// TestBuildRBACLeavesInputAlone: the specs are not modified (trust domain
// mapping included).
func TestBuildRBACLeavesInputAlone(t *testing.T) {
	for _, tc := range istioCases {
		policies := istioManifests(t, tc.input(t), tc.action)
		var before []proto.Message
		for _, p := range policies {
			before = append(before, proto.Clone(p.Spec))
		}
		BuildRBAC(tc.action, policies, tc.td)
		for i, p := range policies {
			if !proto.Equal(before[i], p.Spec) {
				t.Errorf("%s: BuildRBAC modified policy %s/%s", tc.out, p.Namespace, p.Name)
			}
		}
	}
}

// randomValues are the values randomRule draws from, by kind: wildcards,
// regex metacharacters, malformed values, and what grpc-go refuses.
var randomValues = map[string][]string{
	"principal": {"cluster.local/ns/a/sa/b", "td1/ns/x/sa/y", "*", "prefix-*", "*-suffix", "*/ns/foo/sa/all", "*-td/ns/foo/sa/p", "a/b"},
	"namespace": {"ns", "ns-*", "*-ns", "*", "a.b", "n*s", "x+y"},
	"sa":        {"sa", "ns/sa", "a.b/c", "x(y)"},
	"td":        {"cluster.local", "td1", "bad*", "*", "*local", "a*b*c"},
	"ip":        {"1.2.3.4", "5.6.0.0/16", "::1", "2001:db8::/32", "bad", "", "fe80::1%eth0", "1.2.3.4/33"},
	"rp":        {"*", "foo*", "foo/*", "foo/bar*", "*foo", "*/foo", "*bar/foo", "https://ex.com/sub", "/*", "x/", "*/"},
	"host":      {"exact.com", "*.suffix.com", "prefix.*", "*", ""},
	"port":      {"80", "65535", "70000", "abc"},
	"method":    {"GET", "POST", "P*", "*ST", "*"},
	"path":      {"/exact", "/prefix/*", "*/suffix", "*", "/a/{*}", "/{**}/b", ""},
	"generic":   {"v", "v*", "*v", "*", "[v]", "[v*]", ""},
	"key": {"request.headers[x-foo]", "request.headers[Grpc-Timeout]", "request.headers[:scheme]", "request.headers[]", "request.headersx",
		"request.auth.claims[iss]", "request.auth.claims[a][b]", "request.auth.claims[", "experimental.envoy.filters.a.b[c]",
		"experimental.envoy.filters.a.b", "destination.ip", "destination.port", "connection.sni", "source.ip", "remote.ip",
		"source.namespace", "source.principal", "source.trustDomain", "source.serviceAccount", "request.auth.principal",
		"request.auth.audiences", "request.auth.presenter", "unknown.key"},
}

// keyKind is the kind of values a when key takes.
var keyKind = map[string]string{
	"source.principal": "principal", "source.trustDomain": "td", "source.ip": "ip", "remote.ip": "ip", "destination.ip": "ip",
	"destination.port": "port", "request.auth.principal": "rp", "source.namespace": "namespace", "source.serviceAccount": "sa",
}

func randomPick(r *rand.Rand, kind string) []string {
	if r.Intn(3) == 0 {
		return nil
	}
	var out []string
	for range 1 + r.Intn(3) {
		vs := randomValues[kind]
		out = append(out, vs[r.Intn(len(vs))])
	}
	return out
}

// randomRule is a rule of random from, to and when.
func randomRule(r *rand.Rand) *securityv1beta1.Rule {
	rule := &securityv1beta1.Rule{}
	for range r.Intn(3) {
		rule.From = append(rule.From, &securityv1beta1.Rule_From{Source: &securityv1beta1.Source{
			Principals: randomPick(r, "principal"), NotPrincipals: randomPick(r, "principal"),
			RequestPrincipals: randomPick(r, "rp"), NotRequestPrincipals: randomPick(r, "rp"),
			Namespaces: randomPick(r, "namespace"), NotNamespaces: randomPick(r, "namespace"),
			ServiceAccounts: randomPick(r, "sa"), NotServiceAccounts: randomPick(r, "sa"),
			TrustDomains: randomPick(r, "td"), NotTrustDomains: randomPick(r, "td"),
			IpBlocks: randomPick(r, "ip"), NotIpBlocks: randomPick(r, "ip"),
			RemoteIpBlocks: randomPick(r, "ip"), NotRemoteIpBlocks: randomPick(r, "ip"),
		}})
	}
	for range r.Intn(3) {
		rule.To = append(rule.To, &securityv1beta1.Rule_To{Operation: &securityv1beta1.Operation{
			Hosts: randomPick(r, "host"), NotHosts: randomPick(r, "host"),
			Ports: randomPick(r, "port"), NotPorts: randomPick(r, "port"),
			Methods: randomPick(r, "method"), NotMethods: randomPick(r, "method"),
			Paths: randomPick(r, "path"), NotPaths: randomPick(r, "path"),
		}})
	}
	keys := randomValues["key"]
	for range r.Intn(4) {
		k := keys[r.Intn(len(keys))]
		kind := keyKind[k]
		if kind == "" {
			kind = "generic"
		}
		rule.When = append(rule.When, &securityv1beta1.Condition{Key: k, Values: randomPick(r, kind), NotValues: randomPick(r, kind)})
	}
	return rule
}

// randomRBACs is what BuildRBAC makes of n random rules, for each action
// and some trust domain bundles, in RBACs of at most 50 policies.
func randomRBACs(n int) []*rbacpb.RBAC {
	r := rand.New(rand.NewSource(1))
	bundles := []TrustDomainBundle{{}, {TrustDomains: []string{"td1", "cluster.local"}}}
	var out []*rbacpb.RBAC
	for _, action := range []rbacpb.RBAC_Action{rbacpb.RBAC_ALLOW, rbacpb.RBAC_DENY} {
		for _, td := range bundles {
			var policies []Policy
			for i := range n {
				policies = append(policies, Policy{Namespace: "ns", Name: strconv.Itoa(i), Spec: &securityv1beta1.AuthorizationPolicy{
					Rules: []*securityv1beta1.Rule{randomRule(r), randomRule(r)},
				}})
				if len(policies) == 25 || i == n-1 {
					if rbac, _ := BuildRBAC(action, policies, td); rbac != nil {
						out = append(out, rbac)
					}
					policies = nil
				}
			}
		}
	}
	return out
}

// TestBuildRBACRandomRulesProduceValidRBAC: whatever the rules, what
// BuildRBAC produces passes validation and grpcRBACRefusal.
func TestBuildRBACRandomRulesProduceValidRBAC(t *testing.T) {
	for _, r := range randomRBACs(500) {
		checkProduced(t, r)
	}
}

// producedRBACs is every RBAC this file's tests make BuildRBAC produce.
func producedRBACs(t *testing.T) map[string]*rbacpb.RBAC {
	out := map[string]*rbacpb.RBAC{}
	for _, tc := range istioCases {
		if r, _ := BuildRBAC(tc.action, istioManifests(t, tc.input(t), tc.action), tc.td); r != nil {
			out["istio "+tc.out] = r
		}
	}
	for _, tc := range deviationCases() {
		if r, _ := BuildRBAC(tc.action, tc.policies(t), tc.td); r != nil {
			out["deviation "+tc.name] = r
		}
	}
	for i, r := range randomRBACs(200) {
		out[fmt.Sprintf("random %d", i)] = r
	}
	return out
}

// TestRBACAcceptedByGRPC feeds grpc-go's xDS server (the real parser,
// which grpc-go does not export) Listeners carrying the RBAC filters
// BuildRBAC produces: grpc-go must ACK every one. Listeners carrying what
// istiod emits where the hub deviates must be NACKed, both by grpc-go and
// by grpcRBACRefusal (which mirrors grpc-go's parser for the other tests).
func TestRBACAcceptedByGRPC(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a gRPC xDS server")
	}
	g := startGRPCXDS(t)
	for name, r := range producedRBACs(t) {
		if err := g.verdict(r); err != nil {
			t.Errorf("%s: grpc-go NACKs the RBAC: %v", name, err)
		}
	}
	for _, tc := range istiodRefused {
		r := wantRBAC(t, tc.action, tc.rbac)
		if err := g.verdict(r); err == nil || !strings.HasSuffix(err.Error(), tc.grpcGo) {
			t.Errorf("%s: grpc-go's verdict on istiod's RBAC is %v; want a NACK ending with %q", tc.name, err, tc.grpcGo)
		}
		if err := grpcRBACRefusal(r); err == nil || !strings.Contains(err.Error(), tc.mirror) {
			t.Errorf("%s: grpcRBACRefusal = %v; want an error with %q", tc.name, err, tc.mirror)
		}
	}
}

// istiodRefused are RBACs istiod emits that grpc-go refuses, the end of
// grpc-go's NACK and a part of grpcRBACRefusal's error.
var istiodRefused = []struct {
	name           string
	action         rbacpb.RBAC_Action
	rbac           string
	grpcGo, mirror string
}{
	{
		// From Istio's allow-path-out.yaml.
		name:   "uri_template",
		action: rbacpb.RBAC_ALLOW,
		rbac: `
policies:
  foo-httpbin-1-0:
    permissions:
    - andRules:
        rules:
        - orRules:
            rules:
            - urlPath: {path: {exact: /exact}}
            - uriTemplate:
                name: uri-template
                typedConfig:
                  '@type': type.googleapis.com/envoy.extensions.path.match.uri_template.v3.UriTemplateMatchConfig
                  pathTemplate: /path/template/*
    principals: [{andIds: {ids: [{any: true}]}}]
`,
		grpcGo: "rbac: error constructing matching engine: unsupported permission rule type: *rbacv3.Permission_UriTemplate",
		mirror: "unsupported permission rule type: *rbacv3.Permission_UriTemplate",
	},
	{
		name:   "grpc- header",
		action: rbacpb.RBAC_DENY,
		rbac: `
policies:
  foo-p-0:
    permissions: [{andRules: {rules: [{any: true}]}}]
    principals: [{andIds: {ids: [{orIds: {ids: [{header: {name: Grpc-Timeout, stringMatch: {exact: 1S}}}]}}]}}]
`,
		grpcGo: `rbac: header matcher for "Grpc-Timeout" starts with "grpc-"`,
		mirror: `gRPC's RBAC refuses header matchers on "grpc-" headers`,
	},
	{
		name:   ":scheme header",
		action: rbacpb.RBAC_DENY,
		rbac: `
policies:
  foo-p-0:
    permissions: [{andRules: {rules: [{any: true}]}}]
    principals: [{andIds: {ids: [{notId: {orIds: {ids: [{header: {name: ":scheme", stringMatch: {exact: https}}}]}}}]}}]
`,
		grpcGo: `rbac: header matcher for ":scheme" is ":scheme"`,
		mirror: `gRPC's RBAC refuses header matchers on ":scheme"`,
	},
}

// grpcXDS is a grpc-go xDS server (google.golang.org/grpc/xds) and the
// minimal ADS server of the test it reads its Listener from.
type grpcXDS struct {
	t        *testing.T
	name     string       // the Listener resource name grpc-go asks for
	addr     *net.TCPAddr // the address it serves
	push     chan *discoverypb.DiscoveryResponse
	requests chan *discoverypb.DiscoveryRequest
	version  int
}

const listenerTypeURL = "type.googleapis.com/envoy.config.listener.v3.Listener"

// startGRPCXDS starts both servers and waits for grpc-go's Listener request.
func startGRPCXDS(t *testing.T) *grpcXDS {
	g := &grpcXDS{t: t, push: make(chan *discoverypb.DiscoveryResponse), requests: make(chan *discoverypb.DiscoveryRequest, 16)}
	adsLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ads := grpc.NewServer()
	discoverypb.RegisterAggregatedDiscoveryServiceServer(ads, &testADS{push: g.push, requests: g.requests})
	go func() { _ = ads.Serve(adsLis) }()
	t.Cleanup(ads.Stop)

	bootstrap := fmt.Sprintf(`{"xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
		"node": {"id": "authz-test"}, "server_listener_resource_name_template": "grpc/server?xds.resource.listening_address=%%s"}`, adsLis.Addr().String())
	srv, err := xds.NewGRPCServer(grpc.Creds(insecure.NewCredentials()), xds.BootstrapContentsForTesting([]byte(bootstrap)))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g.addr = lis.Addr().(*net.TCPAddr)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	req := g.next(func(r *discoverypb.DiscoveryRequest) bool { return len(r.GetResourceNames()) == 1 })
	g.name = req.GetResourceNames()[0]
	return g
}

// next is the next Listener request satisfying ok.
func (g *grpcXDS) next(ok func(*discoverypb.DiscoveryRequest) bool) *discoverypb.DiscoveryRequest {
	timeout := time.After(30 * time.Second)
	for {
		select {
		case r := <-g.requests:
			if r.GetTypeUrl() == listenerTypeURL && ok(r) {
				return r
			}
		case <-timeout:
			g.t.Fatal("no request from grpc-go's xDS client")
		}
	}
}

// verdict sends grpc-go the Listener with an RBAC filter of rules: nil
// if it ACKs, its NACK's error otherwise.
func (g *grpcXDS) verdict(rules *rbacpb.RBAC) error {
	g.version++
	v := strconv.Itoa(g.version)
	l := inboundListener(g.t, g.name, g.addr, &rbachttp.RBAC{Rules: rules})
	g.push <- &discoverypb.DiscoveryResponse{VersionInfo: v, Nonce: v, TypeUrl: listenerTypeURL, Resources: []*anypb.Any{anyPB(g.t, l)}}
	r := g.next(func(r *discoverypb.DiscoveryRequest) bool { return r.GetResponseNonce() == v })
	if d := r.GetErrorDetail(); d != nil {
		return fmt.Errorf("NACK: %s", d.GetMessage())
	}
	return nil
}

// inboundListener is a Listener as istiod's grpcgen makes an inbound one
// (plaintext): an RBAC filter of rbac, then the router.
func inboundListener(t *testing.T, name string, addr *net.TCPAddr, rbac *rbachttp.RBAC) *listenerpb.Listener {
	hcm := &hcmpb.HttpConnectionManager{
		RouteSpecifier: &hcmpb.HttpConnectionManager_RouteConfig{RouteConfig: &routepb.RouteConfiguration{
			Name: "inbound",
			VirtualHosts: []*routepb.VirtualHost{{Name: "inbound", Domains: []string{"*"}, Routes: []*routepb.Route{{
				Match:  &routepb.RouteMatch{PathSpecifier: &routepb.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routepb.Route_NonForwardingAction{NonForwardingAction: &routepb.NonForwardingAction{}},
			}}}},
		}},
		HttpFilters: []*hcmpb.HttpFilter{
			{Name: "envoy.filters.http.rbac", ConfigType: &hcmpb.HttpFilter_TypedConfig{TypedConfig: anyPB(t, rbac)}},
			{Name: "envoy.filters.http.router", ConfigType: &hcmpb.HttpFilter_TypedConfig{TypedConfig: anyPB(t, &routerpb.Router{})}},
		},
	}
	return &listenerpb.Listener{
		Name: name,
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: addr.IP.String(), PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(addr.Port)},
		}}},
		FilterChains: []*listenerpb.FilterChain{{Name: "inbound", Filters: []*listenerpb.Filter{{
			Name: "inbound-hcm", ConfigType: &listenerpb.Filter_TypedConfig{TypedConfig: anyPB(t, hcm)},
		}}}},
	}
}

func anyPB(t *testing.T, m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// testADS is an ADS server that sends what is pushed and passes on what
// it is asked.
type testADS struct {
	discoverypb.UnimplementedAggregatedDiscoveryServiceServer
	push     <-chan *discoverypb.DiscoveryResponse
	requests chan<- *discoverypb.DiscoveryRequest
}

func (a *testADS) StreamAggregatedResources(s discoverypb.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	go func() {
		for {
			r, err := s.Recv()
			if err != nil {
				return
			}
			select {
			case a.requests <- r:
			case <-s.Context().Done():
				return
			}
		}
	}()
	for {
		select {
		case resp := <-a.push:
			if err := s.Send(resp); err != nil {
				return err
			}
		case <-s.Context().Done():
			return nil
		}
	}
}

// istioCases are Istio's builder tests BuildRBAC is held to; their
// policies and expected RBACs are in testdata/istio.
var istioCases = []istioCase{
	// the template paths taken out of paths and notPaths, and their uriTemplate permissions out of the expected policy
	{name: "allow-full-rule", out: "allow-full-rule-out.yaml", action: rbacpb.RBAC_ALLOW},
	// likewise
	{name: "allow-path", out: "allow-path-out.yaml", action: rbacpb.RBAC_ALLOW},
	{name: "multiple-policies", out: "multiple-policies-out.yaml", action: rbacpb.RBAC_ALLOW},
	{name: "trust-domains", out: "trust-domains-out.yaml", action: rbacpb.RBAC_ALLOW},
	{name: "simple-policy-td-aliases", out: "simple-policy-td-aliases-out.yaml", action: rbacpb.RBAC_ALLOW, td: TrustDomainBundle{TrustDomains: []string{"td1", "cluster.local"}}},
	{name: "simple-policy-multiple-td-aliases", out: "simple-policy-multiple-td-aliases-out.yaml", action: rbacpb.RBAC_ALLOW, td: TrustDomainBundle{TrustDomains: []string{"td1", "cluster.local", "some-td"}}},
	{name: "simple-policy-principal-with-wildcard", out: "simple-policy-principal-with-wildcard-out.yaml", action: rbacpb.RBAC_ALLOW, td: TrustDomainBundle{TrustDomains: []string{"td1", "foobar"}}},
	{name: "td-aliases-source-principal", out: "td-aliases-source-principal-out.yaml", action: rbacpb.RBAC_ALLOW, td: TrustDomainBundle{TrustDomains: []string{"new-td", "old-td", "some-trustdomain"}}},
	{name: "deny-and-allow", out: "deny-and-allow-out1.yaml", action: rbacpb.RBAC_DENY},
	{name: "deny-and-allow", out: "deny-and-allow-out2.yaml", action: rbacpb.RBAC_ALLOW},
}
