package main

import (
	"bytes"
	"testing"
)

// TestListenWatch: the hub's output reaches its log unchanged, and the
// addresses of its "hub listening" line are found once, however the
// output is split into writes.
func TestListenWatch(t *testing.T) {
	out := `{"level":"INFO","msg":"listener disabled","listener":"bundle"}` + "\n" +
		`{"level":"INFO","msg":"hub listening","cluster":"primary","xds":"127.0.0.1:15010","admin":"127.0.0.1:8080","xds-tls":"127.0.0.1:15012"}` + "\n" +
		`{"level":"INFO","msg":"hub listening","admin":"again"}` + "\n"
	for _, chunk := range []int{1, 7, len(out)} {
		var log bytes.Buffer
		found := make(chan map[string]string, 1)
		w := &listenWatch{w: &log, found: found}
		for i := 0; i < len(out); i += chunk {
			if _, err := w.Write([]byte(out[i:min(i+chunk, len(out))])); err != nil {
				t.Fatal(err)
			}
		}
		if log.String() != out {
			t.Errorf("chunks of %d: the log is %q; want the output unchanged", chunk, log.String())
		}
		select {
		case addrs := <-found:
			if len(addrs) != 3 || addrs["admin"] != "127.0.0.1:8080" || addrs["xds"] != "127.0.0.1:15010" || addrs["xds-tls"] != "127.0.0.1:15012" {
				t.Errorf("chunks of %d: addresses %v", chunk, addrs)
			}
		default:
			t.Errorf("chunks of %d: no addresses found", chunk)
		}
	}
}
