package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/hubmesh/hub/charts/charttest"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// manifest is one object of a rendered manifest.
type manifest = charttest.Manifest

// grant is one verb on one resource that a role gives a subject: in one
// namespace (a Role) or everywhere (a ClusterRole, ns "*").
type grant struct {
	role, ns, group, resource, verb string
}

func (g grant) String() string {
	return fmt.Sprintf("%s: %s %s.%s in %s", g.role, g.verb, g.resource, g.group, g.ns)
}

// grantsOf lists every verb the manifests' Roles and ClusterRoles give the
// service account ns/name through their bindings.
func grantsOf(t *testing.T, ms []manifest, saNS, sa string) []grant {
	t.Helper()
	roles := map[string][]rbacv1.PolicyRule{} // "Role/ns/name" or "ClusterRole//name"
	var grants []grant
	type binding struct {
		ns      string
		ref     rbacv1.RoleRef
		matches bool
	}
	var bindings []binding
	for _, m := range ms {
		switch m.Kind {
		case "Role", "ClusterRole":
			var r rbacv1.ClusterRole // the same rules field
			if err := yaml.Unmarshal(m.Raw, &r); err != nil {
				t.Fatal(err)
			}
			roles[m.Kind+"/"+m.NS+"/"+m.Name] = r.Rules
		case "RoleBinding", "ClusterRoleBinding":
			var b rbacv1.RoleBinding
			if err := yaml.Unmarshal(m.Raw, &b); err != nil {
				t.Fatal(err)
			}
			bound := slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
				return s.Kind == "ServiceAccount" && s.Namespace == saNS && s.Name == sa
			})
			bindings = append(bindings, binding{ns: m.NS, ref: b.RoleRef, matches: bound})
		}
	}
	for _, b := range bindings {
		if !b.matches {
			continue
		}
		key := b.ref.Kind + "/" + b.ns + "/" + b.ref.Name
		scope := b.ns
		if b.ref.Kind == "ClusterRole" {
			key = "ClusterRole//" + b.ref.Name
			if b.ns == "" {
				scope = "*"
			}
		}
		rules, ok := roles[key]
		if !ok {
			t.Fatalf("binding to %s, which the manifests do not hold", key)
		}
		for _, r := range rules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						grants = append(grants, grant{role: key, ns: scope, group: g, resource: res, verb: v})
					}
				}
			}
		}
	}
	if len(grants) == 0 {
		t.Fatalf("the manifests grant %s/%s nothing", saNS, sa)
	}
	return grants
}

// auditPolicy logs every request of the given users (metadata, once
// answered) and nothing else.
func auditPolicy(users ...string) []byte {
	quoted := make([]string, len(users))
	for i, u := range users {
		quoted[i] = fmt.Sprintf("%q", u)
	}
	return []byte(`apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    users: [` + strings.Join(quoted, ", ") + `]
  - level: None
`)
}

// auditEvent is what the audit log says of one request.
type auditEvent struct {
	AuditID    string `json:"auditID"`
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		APIGroup    string `json:"apiGroup"`
	} `json:"objectRef"`
	Annotations map[string]string `json:"annotations"`
}

func (e auditEvent) resource() string {
	if e.ObjectRef == nil {
		return ""
	}
	if e.ObjectRef.Subresource != "" {
		return e.ObjectRef.Resource + "/" + e.ObjectRef.Subresource
	}
	return e.ObjectRef.Resource
}

func (e auditEvent) String() string {
	if e.ObjectRef == nil {
		return e.Verb + " " + e.RequestURI
	}
	return fmt.Sprintf("%s %s.%s %s/%s", e.Verb, e.resource(), e.ObjectRef.APIGroup, e.ObjectRef.Namespace, e.ObjectRef.Name)
}

func (e auditEvent) forbidden() bool {
	return e.Annotations["authorization.k8s.io/decision"] == "forbid"
}

// readAudit returns the requests of user in an audit log, one event each
// (a watch's last stage).
func readAudit(t *testing.T, path, user string) []auditEvent {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The API server is still writing: a last line without its newline
	// is an event not written whole yet (the next read has it).
	if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
		data = data[:i+1]
	} else {
		data = nil
	}
	byID := map[string]auditEvent{}
	var order []string
	for _, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var e auditEvent
		if err := json.Unmarshal(line, &e); err != nil {
			t.Fatalf("audit log %s: %v", path, err)
		}
		if e.User.Username != user {
			continue
		}
		if _, seen := byID[e.AuditID]; !seen {
			order = append(order, e.AuditID)
		}
		byID[e.AuditID] = e
	}
	out := make([]auditEvent, 0, len(order))
	for _, id := range order {
		out = append(out, byID[id])
	}
	return out
}

// used reports whether an allowed request of events used grant g.
func used(events []auditEvent, g grant) bool {
	for _, e := range events {
		if e.forbidden() || e.ObjectRef == nil || e.Verb != g.verb || e.ObjectRef.APIGroup != g.group || e.resource() != g.resource {
			continue
		}
		if g.ns == "*" || e.ObjectRef.Namespace == g.ns {
			return true
		}
	}
	return false
}

// unused lists the grants no allowed request of events used yet but those
// listed in unexercised.
func unused(events []auditEvent, grants []grant, unexercised map[string]string) []string {
	var out []string
	for _, g := range grants {
		if _, expected := unexercised[g.String()]; !expected && !used(events, g) {
			out = append(out, g.String())
		}
	}
	return out
}

// requireAudited checks one identity's audit log against what its roles
// grant: no request was forbidden (but those tolerate accepts), and every
// granted verb was used by an allowed request, so that taking any verb
// away makes a request the identity needs forbidden. unexercised names
// grants this run cannot reach, each with the reason (String form → why);
// one that is used after all is an error too, so the list stays true.
func requireAudited(t *testing.T, who string, events []auditEvent, grants []grant, tolerate func(auditEvent) bool, unexercised map[string]string) {
	t.Helper()
	if len(events) == 0 {
		t.Fatalf("%s: no request in the audit log", who)
	}
	tolerated := 0
	for _, e := range events {
		if !e.forbidden() {
			continue
		}
		if tolerate != nil && tolerate(e) {
			tolerated++
			continue
		}
		t.Errorf("%s was forbidden: %s (%s)", who, e, e.Annotations["authorization.k8s.io/reason"])
	}
	var exercised, skipped []string
	for _, g := range grants {
		why, expected := unexercised[g.String()]
		switch u := used(events, g); {
		case u && expected:
			t.Errorf("%s used %s, listed as not exercised (%s): drop it from the list", who, g, why)
		case u:
			exercised = append(exercised, g.String())
		case expected:
			skipped = append(skipped, g.String()+" ("+why+")")
		default:
			t.Errorf("%s never used %s: the test does not prove this verb is needed (exercise it, or list it with the reason)", who, g)
		}
	}
	for k := range unexercised {
		if !slices.ContainsFunc(grants, func(g grant) bool { return g.String() == k }) {
			t.Errorf("%s: %q is listed as not exercised but not granted", who, k)
		}
	}
	sort.Strings(exercised)
	t.Logf("%s: %d requests audited, %d forbidden ones tolerated; %d granted verbs used:\n  %s\nnot exercised here:\n  %s",
		who, len(events), tolerated, len(exercised), strings.Join(exercised, "\n  "), strings.Join(skipped, "\n  "))
}
