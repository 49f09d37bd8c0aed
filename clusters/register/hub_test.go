package register

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// waitReady returns once the member is Ready with the wanted kubeconfig,
// and reports the other states it saw on the way.
func TestWaitReady(t *testing.T) {
	var calls atomic.Int32
	answers := []string{
		`404`,
		`{"state":"Syncing","message":"waiting","kubeconfigSHA256":"new"}`,
		`{"state":"Ready","kubeconfigSHA256":"old"}`,
		`{"state":"Ready","kubeconfigSHA256":"new"}`,
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/clusters/west" || r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		a := answers[min(int(calls.Add(1))-1, len(answers)-1)]
		if a == "404" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, a)
	}))
	defer srv.Close()
	h := &Hub{URL: srv.URL + "/", Token: "tok", Poll: time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	notReady, err := h.waitReady(ctx, "west", "new")
	if err != nil || strings.Join(notReady, ",") != "Syncing" || calls.Load() != 4 {
		t.Errorf("waitReady: %v, not ready %v after %d calls", err, notReady, calls.Load())
	}
}

func TestWaitReadyFails(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		want   string
	}{
		{http.StatusOK, `{"state":"Ready","kubeconfigSHA256":"old"}`, "last seen: Ready, still with the previous kubeconfig"},
		{http.StatusOK, `{"state":"Ready"}`, "it is older than this command"},
		{http.StatusForbidden, `{"title":"Forbidden"}`, `hub answered 403 Forbidden: {"title":"Forbidden"} (check --hub-token-file)`},
		{http.StatusBadGateway, `down`, `last seen: hub answered 502 Bad Gateway: down`},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tc.status)
			fmt.Fprint(w, tc.body)
		}))
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_, err := (&Hub{URL: srv.URL, Poll: 10 * time.Millisecond}).waitReady(ctx, "west", "new")
		cancel()
		srv.Close()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%d %s: %v; want an error saying %q", tc.status, tc.body, err, tc.want)
		}
	}
}
