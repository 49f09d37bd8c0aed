package listening

import (
	"bytes"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"testing"
)

// TestAddrsReadsWhatSlogWrites: the line as the hub's JSON handler writes
// it is found, with its listeners and nothing else; other lines are not.
func TestAddrsReadsWhatSlogWrites(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	log.Info("hub starting", "xds", "not this one")
	log.Info(Message, "cluster", "primary", "xds", "127.0.0.1:15010", "admin", "127.0.0.1:8080", "adminTLS", true)
	log.Info(Message, "xds", "the second line")
	path := filepath.Join(t.TempDir(), "hub.log")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"xds": "127.0.0.1:15010", "admin": "127.0.0.1:8080"}
	if got := InFile(path); !maps.Equal(got, want) {
		t.Errorf("InFile = %v; want %v", got, want)
	}
	first, _, _ := bytes.Cut(buf.Bytes(), []byte("\n"))
	if got := Addrs(first); got != nil {
		t.Errorf("Addrs of another line = %v; want nil", got)
	}
	if got := InFile(filepath.Join(t.TempDir(), "absent.log")); got != nil {
		t.Errorf("InFile of no file = %v; want nil", got)
	}
}
