package trust

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// MaxDNSNames bounds the DNS names on the hub's serving certificate.
const MaxDNSNames = 32

// ParseDNSNames reads a comma-separated list of DNS names for the hub's
// serving certificate: each a lowercase DNS-1123 subdomain, or one with a
// leading "*." wildcard label; duplicates are dropped, order kept.
func ParseDNSNames(list string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, raw := range strings.Split(list, ",") {
		name := strings.TrimSpace(raw)
		if name == "" || seen[name] {
			continue
		}
		check := strings.TrimPrefix(name, "*.")
		if errs := validation.IsDNS1123Subdomain(check); len(errs) > 0 || strings.Contains(check, "*") {
			return nil, fmt.Errorf("%q is not a DNS name (lowercase letters, digits, '-' and '.', optionally starting with \"*.\"): %s", name, strings.Join(errs, "; "))
		}
		seen[name] = true
		out = append(out, name)
	}
	if len(out) > MaxDNSNames {
		return nil, fmt.Errorf("%d DNS names; at most %d", len(out), MaxDNSNames)
	}
	return out, nil
}
