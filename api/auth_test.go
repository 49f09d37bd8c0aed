package api

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestStaticTokensReload: a token removed from the file stops working; a
// file that becomes invalid or unreadable keeps the last good tokens.
func TestStaticTokensReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(path+".tmp", []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	write("tok-a,ann,write\ntok-b,bob,read\n")
	st, err := LoadStaticTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	st.every = 0 // check the file on every use
	ctx := context.Background()
	valid := func(token string) bool {
		t.Helper()
		_, err := st.Authenticate(ctx, token)
		if err != nil && !errors.Is(err, ErrUnauthenticated) {
			t.Fatal(err)
		}
		return err == nil
	}
	if !valid("tok-a") || !valid("tok-b") {
		t.Fatal("tokens from the file are not accepted")
	}
	write("tok-a,ann,write\n")
	if valid("tok-b") || !valid("tok-a") {
		t.Errorf("after removing tok-b: tok-b valid %v, tok-a valid %v", valid("tok-b"), valid("tok-a"))
	}
	write("tok-a,ann\n") // invalid: kept the last good tokens
	if !valid("tok-a") {
		t.Errorf("an invalid file revoked the last good tokens")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if !valid("tok-a") {
		t.Errorf("an unreadable file revoked the last good tokens")
	}
	write("tok-c,cy,read\n")
	if valid("tok-a") || !valid("tok-c") {
		t.Errorf("after replacing the file: tok-a valid %v, tok-c valid %v", valid("tok-a"), valid("tok-c"))
	}
	write("# every token revoked\n") // emptied on purpose: revokes them all
	if valid("tok-c") {
		t.Errorf("an emptied file kept tok-c")
	}
}

func TestAudienceMatches(t *testing.T) {
	for _, tc := range []struct {
		want, got []string
		ok        bool
	}{
		{nil, nil, true},
		{nil, []string{"x"}, true},
		{[]string{"hub"}, []string{"hub"}, true},
		{[]string{"hub"}, []string{"api", "hub"}, true},
		{[]string{"hub"}, nil, false},
		{[]string{"hub"}, []string{"api"}, false},
	} {
		if got := audienceMatches(tc.want, tc.got); got != tc.ok {
			t.Errorf("audienceMatches(%v, %v) = %v", tc.want, tc.got, got)
		}
	}
}
