package main

import (
	"flag"
	"net"
	"strings"
	"testing"
)

func TestFederatedDomainFlag(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{nil, ""}, // clusterset.local
		{[]string{"--federated-domain", "mesh.example"}, ""},
		{[]string{"--federated-domain", "cluster.local"}, "must differ from --domain-suffix"},
		{[]string{"--federated-domain", "Not A Domain"}, "is not a DNS name"},
		{[]string{"--federated-domain", ""}, "is not a DNS name"},
	} {
		var c config
		fs := flag.NewFlagSet("hub", flag.ContinueOnError)
		c.register(fs)
		if err := parseFlags(fs, tc.args); err != nil {
			t.Fatal(err)
		}
		err := c.validate()
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%v: error %v, want one saying %q", tc.args, err, tc.wantErr)
		}
	}
	var c config
	fs := flag.NewFlagSet("hub", flag.ContinueOnError)
	c.register(fs)
	if err := parseFlags(fs, nil); err != nil || c.federatedDomain != "clusterset.local" {
		t.Errorf("default --federated-domain %q (%v), want clusterset.local", c.federatedDomain, err)
	}
}

func TestRequireListeners(t *testing.T) {
	lis := func(names ...string) map[string]net.Listener {
		out := map[string]net.Listener{}
		for _, n := range names {
			out[n] = &net.TCPListener{}
		}
		return out
	}
	for _, tc := range []struct {
		open []string
		ok   bool
	}{
		{[]string{"admin", "xds", "xds-tls"}, true},
		{[]string{"admin", "xds-tls"}, true}, // --xds-addr=""
		{[]string{"admin", "xds"}, true},     // --xds-tls-addr=""
		{[]string{"admin"}, false},
		{[]string{"xds", "xds-tls"}, false},
	} {
		if err := requireListeners(lis(tc.open...)); (err == nil) != tc.ok {
			t.Errorf("listeners %v: %v; want ok %v", tc.open, err, tc.ok)
		}
	}
}
