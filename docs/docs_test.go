// Package docs holds the design of record (architecture.md) and the
// performance record (performance.md); its test keeps the code's
// citations of them true.
package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// citation is how code cites a section of the design: "docs/architecture.md §3.7".
var citation = regexp.MustCompile(`docs/architecture\.md §([0-9]+(?:\.[0-9]+)?)`)

// heading is a numbered section of architecture.md: "## 4. …", "### 3.7 …".
var heading = regexp.MustCompile(`(?m)^#{2,3} ([0-9]+(?:\.[0-9]+)?)\.? `)

// Every section of docs/architecture.md that a Go file of the repository
// cites exists.
func TestCitedSectionsExist(t *testing.T) {
	doc, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(string(doc), -1) {
		sections[m[1]] = true
	}
	if len(sections) < 10 {
		t.Fatalf("found %d numbered sections in architecture.md; the heading pattern is out of date", len(sections))
	}
	cited := 0
	err = filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range citation.FindAllStringSubmatch(string(src), -1) {
			cited++
			if !sections[m[1]] {
				t.Errorf("%s cites docs/architecture.md §%s, which has no such section", path, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if cited == 0 {
		t.Error("no Go file cites docs/architecture.md: the citation pattern is out of date")
	}
}
