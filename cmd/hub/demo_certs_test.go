package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestDemoCABundleRefused: when the hub's API refuses the trust bundle,
// the demo says what it answered (not a formatting artefact).
func TestDemoCABundleRefused(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no trust domain cluster.local", http.StatusNotFound)
	}))
	defer srv.Close()
	_, err := newDemoCA(context.Background(), srv.URL, "token", "cluster.local", "127.0.0.1:1")
	if err == nil {
		t.Fatal("newDemoCA succeeded without a bundle")
	}
	if msg := err.Error(); strings.Contains(msg, "%!") || !strings.Contains(msg, "404") || !strings.Contains(msg, "no trust domain cluster.local") {
		t.Errorf("error %q; want the status and the API's answer", msg)
	}
}
