package clip

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// A cut string is at most n bytes, valid UTF-8 and says it was cut; a
// short one is left as it is.
func TestString(t *testing.T) {
	if got := String("short", 64); got != "short" {
		t.Fatalf("String(short) = %q", got)
	}
	long := strings.Repeat("é", 100) // two bytes each: some cuts fall inside one
	for n := 20; n < 40; n++ {
		got := String(long, n)
		if len(got) > n || !utf8.ValidString(got) || !strings.HasSuffix(got, "(truncated)") {
			t.Fatalf("String(long, %d) = %q (%d bytes)", n, got, len(got))
		}
	}
}
