package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// Markers around the flag reference in docs/reference.md: the output of
// `hub serve --help` (flag.PrintDefaults), kept in step by this test.
const (
	readmeFlagsBegin = "<!-- hub serve --help: begin (cmd/hub/readme_test.go keeps it in step) -->\n```text\n"
	readmeFlagsEnd   = "```\n<!-- hub serve --help: end -->"
)

// docs/reference.md's flag reference is exactly what `hub serve --help` prints: every
// flag, its default and its meaning. On a difference, the test prints the
// block to paste (or run with HUB_UPDATE_README=1 to write it).
func TestREADMEFlagReference(t *testing.T) {
	fs, _, _ := command("serve", &config{})
	var help bytes.Buffer
	fs.SetOutput(&help)
	fs.PrintDefaults()
	data, err := os.ReadFile("../../docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	begin := strings.Index(readme, readmeFlagsBegin)
	end := strings.Index(readme, readmeFlagsEnd)
	if begin < 0 || end < begin {
		t.Fatalf("docs/reference.md has no flag reference between %q and %q", readmeFlagsBegin, readmeFlagsEnd)
	}
	got := readme[begin+len(readmeFlagsBegin) : end]
	if got == help.String() {
		return
	}
	if os.Getenv("HUB_UPDATE_README") == "1" {
		updated := readme[:begin+len(readmeFlagsBegin)] + help.String() + readme[end:]
		if err := os.WriteFile("../../docs/reference.md", []byte(updated), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("docs/reference.md's flag reference differs from `hub serve --help`; run HUB_UPDATE_README=1 go test ./cmd/hub -run TestREADMEFlagReference, or paste:\n%s", help.String())
}
