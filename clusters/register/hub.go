package register

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Hub reads a member's status from the hub's REST API
// (GET /api/v1/clusters/{id}, docs/architecture.md §3.3).
type Hub struct {
	URL    string // the admin port's base URL, e.g. https://hub.example:8080
	Token  string // bearer token for the API ("" sends none)
	Client *http.Client
	// Poll is how often the status is read while waiting (default 500ms).
	Poll time.Duration
}

// memberStatus is the part of the API's Cluster that `hub register` reads.
type memberStatus struct {
	State            string `json:"state"`
	Message          string `json:"message"`
	KubeconfigSHA256 string `json:"kubeconfigSHA256"`
}

// status reads one member's status; found is false on 404.
func (h *Hub) status(ctx context.Context, id string) (st memberStatus, found bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(h.URL, "/")+"/api/v1/clusters/"+url.PathEscape(id), nil)
	if err != nil {
		return st, false, fmt.Errorf("hub URL: %w", err)
	}
	if h.Token != "" {
		req.Header.Set("Authorization", "Bearer "+h.Token)
	}
	client := h.Client
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	resp, err := client.Do(req)
	if err != nil {
		return st, false, fmt.Errorf("asking the hub: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return st, false, fmt.Errorf("reading the hub's answer: %w", err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return st, false, nil
	case http.StatusUnauthorized, http.StatusForbidden:
		return st, false, &deniedError{fmt.Sprintf("hub answered %s: %s (check --hub-token-file)", resp.Status, truncate(string(body), 300))}
	default:
		return st, false, fmt.Errorf("hub answered %s: %s", resp.Status, truncate(string(body), 300))
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return st, false, fmt.Errorf("decoding the hub's answer: %w", err)
	}
	return st, true, nil
}

// waitReady waits until the hub reports the member Ready with the
// kubeconfig whose SHA-256 is sha (hex): the hub has synced a client with
// it and serves from that client. It returns the states the member was
// seen in other than Ready meanwhile, for the caller to report (during a
// rotation there must be none).
func (h *Hub) waitReady(ctx context.Context, id, sha string) (notReady []string, err error) {
	poll := h.Poll
	if poll <= 0 {
		poll = 500 * time.Millisecond
	}
	tick := time.NewTicker(poll)
	defer tick.Stop()
	var last string
	for {
		st, found, err := h.status(ctx, id)
		switch {
		case err != nil && ctx.Err() != nil: // cut short by the wait's end: keep what was seen
		case errors.As(err, new(*deniedError)):
			return notReady, err // asking again does not help
		case err != nil:
			last = err.Error()
		case !found:
			last = "the hub does not list the cluster yet"
		case st.State != "Ready":
			last = fmt.Sprintf("%s: %s", st.State, st.Message)
			if len(notReady) == 0 || notReady[len(notReady)-1] != st.State {
				notReady = append(notReady, st.State)
			}
		case st.KubeconfigSHA256 == "":
			return notReady, errors.New("the hub does not report which kubeconfig a member runs (kubeconfigSHA256): it is older than this command")
		case st.KubeconfigSHA256 != sha:
			last = "Ready, still with the previous kubeconfig"
		default:
			return notReady, nil
		}
		select {
		case <-ctx.Done():
			return notReady, fmt.Errorf("the hub did not report cluster %s Ready with the new kubeconfig in time (last seen: %s): %w", id, last, context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// deniedError is the hub refusing the API token.
type deniedError struct{ msg string }

func (e *deniedError) Error() string { return e.msg }

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
