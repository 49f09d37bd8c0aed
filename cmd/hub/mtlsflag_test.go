package main

import (
	"flag"
	"strings"
	"testing"
)

func TestMTLSModeFlag(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{nil, ""}, // PERMISSIVE
		{[]string{"--mtls-mode", "STRICT"}, ""},
		{[]string{"--mtls-mode", "disable"}, ""},
		{[]string{"--mtls-mode", "MUTUAL"}, "--mtls-mode"},
		{[]string{"--mtls-mode", ""}, ""}, // the default, as HUB_MTLS_MODE= means
	} {
		var c config
		fs := flag.NewFlagSet("hub", flag.ContinueOnError)
		c.register(fs)
		if err := parseFlags(fs, tc.args); err != nil {
			t.Fatal(err)
		}
		if tc.args == nil && c.mtlsMode != "PERMISSIVE" {
			t.Errorf("default --mtls-mode %q; want PERMISSIVE", c.mtlsMode)
		}
		err := c.validate()
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%v: error %v, want one saying %q", tc.args, err, tc.wantErr)
		}
	}
}
