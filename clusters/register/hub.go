package register

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
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
	// Settle is how long, once the hub first reports what is waited for,
	// every further answer must report it too (an answer that does not
	// starts the window again). The hub may run several replicas behind
	// one Service, each with member clients of its own, and the API says
	// nothing of which one answers: each poll is a new connection (no
	// keep-alive), so that the Service spreads the polls over them, and
	// the window is what it takes to hear from each. A replica the
	// Service never picks in the window is not heard from (with n
	// replicas and k polls in it, each is missed with probability
	// (1-1/n)^k), and a URL that reaches one replica only (kubectl
	// port-forward) hears from that one. Zero takes the first answer.
	Settle time.Duration
}

// Validate refuses a hub URL that is not http(s), and sending the token
// in clear text: over http:// only to a loopback address (a kubectl
// port-forward).
func (h *Hub) Validate() error {
	u, err := url.Parse(h.URL)
	if err != nil {
		return fmt.Errorf("hub URL: %w", err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("hub URL %q: want http:// or https://", h.URL)
	case u.Host == "":
		return fmt.Errorf("hub URL %q has no host", h.URL)
	case u.Scheme == "http" && h.Token != "" && !loopback(u.Hostname()):
		return fmt.Errorf("hub URL %q is plain http to a host that is not loopback: the API token would cross the network in clear text; use https:// (with --hub-ca-file), or a loopback address (kubectl port-forward)", h.URL)
	}
	if h.Poll < 0 || h.Settle < 0 {
		return fmt.Errorf("the poll interval (%s) and the settle window (%s) must not be negative", h.Poll, h.Settle)
	}
	return nil
}

// loopback reports whether host is localhost or a loopback IP.
func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// memberStatus is the part of the API's Cluster that `hub register` reads.
type memberStatus struct {
	State   string `json:"state"`
	Message string `json:"message"`
	// Secret is the remote Secret the member comes from: none for the
	// home cluster (hub serve --cluster-id), which the API lists too.
	Secret           string `json:"secret"`
	KubeconfigSHA256 string `json:"kubeconfigSHA256"`
}

// status reads one member's status; found is false on 404. Every call is
// a connection of its own (see Settle).
func (h *Hub) status(ctx context.Context, id string) (st memberStatus, found bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(h.URL, "/")+"/api/v1/clusters/"+url.PathEscape(id), nil)
	if err != nil {
		return st, false, fmt.Errorf("hub URL: %w", err)
	}
	req.Close = true // the next poll dials again: the Service may pick another replica
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
// kubeconfig whose SHA-256 is sha (hex), on every answer for Settle: the
// hub has synced a client with it and serves from that client. It returns
// the states the member was seen in other than Ready meanwhile, for the
// caller to report (during a rotation there must be none).
func (h *Hub) waitReady(ctx context.Context, id, sha string) (notReady []string, err error) {
	return h.wait(ctx, id, sha, true)
}

// waitRuns waits until the hub reports the member running the kubeconfig
// whose SHA-256 is sha, in any state, on every answer for Settle.
func (h *Hub) waitRuns(ctx context.Context, id, sha string) error {
	_, err := h.wait(ctx, id, sha, false)
	return err
}

func (h *Hub) wait(ctx context.Context, id, sha string, ready bool) (notReady []string, err error) {
	poll := h.Poll
	if poll <= 0 {
		poll = 500 * time.Millisecond
	}
	tick := time.NewTicker(poll)
	defer tick.Stop()
	var (
		last    string
		since   time.Time // first answer of the current settle window (zero: none)
		answers int       // in that window
	)
	want := "running the kubeconfig"
	if ready {
		want = "Ready with the kubeconfig"
	}
	for {
		st, found, err := h.status(ctx, id)
		took := false
		switch {
		case err != nil && ctx.Err() != nil: // cut short by the wait's end: keep what was seen
		case errors.As(err, new(*deniedError)):
			return notReady, err // asking again does not help
		case err != nil:
			last = err.Error()
		case !found:
			last = "the hub does not list the cluster"
		case st.State != "Ready" && ready:
			last = fmt.Sprintf("%s: %s", st.State, st.Message)
			if len(notReady) == 0 || notReady[len(notReady)-1] != st.State {
				notReady = append(notReady, st.State)
			}
		case st.KubeconfigSHA256 == "":
			return notReady, errors.New("the hub does not report which kubeconfig a member runs (kubeconfigSHA256): it is older than this command")
		case st.KubeconfigSHA256 != sha:
			last = st.State + ", with another kubeconfig"
			if !since.IsZero() {
				last += fmt.Sprintf(" (after %d answer(s) with this one: another replica has not switched yet)", answers)
			}
		default:
			took = true
		}
		switch {
		case took && since.IsZero():
			since, answers = time.Now(), 1
		case took:
			answers++
		case ctx.Err() == nil:
			since, answers = time.Time{}, 0 // every answer of the window must show it
		}
		if took && time.Since(since) >= h.Settle {
			return notReady, nil
		}
		select {
		case <-ctx.Done():
			if !since.IsZero() {
				last = fmt.Sprintf("%s on %d answer(s) over %s, short of the %s settle window", want, answers, time.Since(since).Round(time.Millisecond), h.Settle)
			}
			return notReady, fmt.Errorf("the hub did not report cluster %s %s %s in time (last seen: %s): %w", id, want, shortSHA(sha), last, context.Cause(ctx))
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

func shortSHA(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return sha
}
