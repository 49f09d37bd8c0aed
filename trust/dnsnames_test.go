package trust

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestParseDNSNames(t *testing.T) {
	got, err := ParseDNSNames(" hub.hub-system.svc, *.hub.example.com,hub.hub-system.svc,, ")
	if err != nil || !slices.Equal(got, []string{"hub.hub-system.svc", "*.hub.example.com"}) {
		t.Fatalf("ParseDNSNames = %v, %v", got, err)
	}
	if got, err := ParseDNSNames(""); err != nil || len(got) != 0 {
		t.Fatalf("empty list: %v, %v", got, err)
	}
	for _, bad := range []string{"Hub.example", "hub_1.example", "a.*.example", "*", "**.example", "10.0.0.1/8", strings.Repeat("a", 254)} {
		if _, err := ParseDNSNames(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	var many []string
	for i := range MaxDNSNames + 1 {
		many = append(many, fmt.Sprintf("h%d.example", i))
	}
	if _, err := ParseDNSNames(strings.Join(many, ",")); err == nil {
		t.Error("more than MaxDNSNames accepted")
	}
}
