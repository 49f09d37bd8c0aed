// Package listening is the contract between `hub serve` and the programs
// that run it as a child (hubdemo, hubbench, the e2e tests): once its
// listeners are open the hub logs one JSON line whose message is Message,
// with each open listener's address under its name (Names); a disabled
// listener is absent.
package listening

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
)

// Message is the message of the hub's "listeners open" log line.
const Message = "hub listening"

// Names are the listeners the line may name.
var Names = []string{"xds", "admin", "xds-tls", "bundle"}

// Addrs returns the listener addresses by name of a JSON log line whose
// message is Message, nil for any other line.
func Addrs(line []byte) map[string]string {
	var entry map[string]any
	if json.Unmarshal(bytes.TrimSpace(line), &entry) != nil || entry["msg"] != Message {
		return nil
	}
	addrs := map[string]string{}
	for _, name := range Names {
		if v, ok := entry[name].(string); ok {
			addrs[name] = v
		}
	}
	return addrs
}

// InFile returns the addresses of the first such line in the log file at
// path, nil if it has none (yet) or cannot be read.
func InFile(path string) map[string]string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		if addrs := Addrs(sc.Bytes()); addrs != nil {
			return addrs
		}
	}
	return nil
}
