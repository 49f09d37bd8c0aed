package clusters

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
)

// memberAPI is a member's API server as the hub reaches it: the clients
// built from its kubeconfig, over one HTTP client of its own whose
// connections the hub tracks (and closes when the member's client stops),
// whose dial refuses the addresses the policy denies, which follows no
// redirect and which reports every request's outcome to the member's
// health. Never modified after newMemberAPI.
type memberAPI struct {
	server      string
	hash        [32]byte // of the kubeconfig's bytes
	warnings    []string // from the kubeconfig, for status
	credentials []CredentialExpiry

	client     kubernetes.Interface // protobuf, for informers and writes
	httpClient *http.Client         // client's, for requests outside client-go's decoders
	meta       metadata.Interface   // the ServiceExport informers
	dynamic    dynamic.Interface    // ServiceExport status
	conns      *connTracker
	health     *memberHealth // told every request's outcome
}

func newMemberAPI(id string, kc *Kubeconfig, health *memberHealth) (*memberAPI, error) {
	cfg := rest.CopyConfig(kc.Config)
	cfg.UserAgent = "hub/" + id
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	cfg.Timeout = 0 // watches are long; per-request timeouts come from contexts
	// A Dial of our own keeps client-go from sharing its cached transport
	// with other clients, and lets stop close this member's connections.
	// For members it also refuses addresses the policy denies (dialGuard).
	a := &memberAPI{server: kc.Server, hash: kc.SHA256, warnings: kc.Warnings, credentials: kc.Credentials, conns: newConnTracker(kc.guard), health: health}
	cfg.Dial = a.conns.DialContext
	// Redirects are refused below the authentication wrappers, so that a
	// member cannot send the hub's credentials for it anywhere else.
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &observingTransport{next: &noRedirectTransport{next: rt}, health: health}
	})
	var err error
	if a.httpClient, err = rest.HTTPClientFor(cfg); err != nil {
		return nil, fmt.Errorf("building HTTP client for cluster %s: %w", id, err)
	}
	a.httpClient.CheckRedirect = refuseRedirect
	// The typed client speaks protobuf, as Kubernetes' own controllers do:
	// its informers list and watch whole objects (mesh pods among them)
	// that the hub strips at once, and protobuf is several times cheaper
	// to send and decode than JSON.
	typed := rest.CopyConfig(cfg)
	typed.ContentType = runtime.ContentTypeProtobuf
	typed.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	if a.client, err = kubernetes.NewForConfigAndClient(typed, a.httpClient); err != nil {
		return nil, fmt.Errorf("building client for cluster %s: %w", id, err)
	}
	if a.meta, err = metadata.NewForConfigAndClient(cfg, a.httpClient); err != nil {
		return nil, fmt.Errorf("cluster %s: building metadata client: %w", id, err)
	}
	if a.dynamic, err = dynamic.NewForConfigAndClient(cfg, a.httpClient); err != nil {
		return nil, fmt.Errorf("cluster %s: building dynamic client: %w", id, err)
	}
	return a, nil
}

// Health probing: informers only notice an API server that stopped
// answering; one whose storage (etcd) hangs keeps its watches open and
// silent. Every healthProbeInterval the member's /readyz (which includes its
// etcd check, and which every authenticated client may read) is asked.
const (
	healthProbeInterval = 10 * time.Second
	healthProbeTimeout  = 5 * time.Second
)

// probeHealth reports a failing or hanging /readyz as a failed request
// (Stale, keeping the member's data) until ctx ends; a passing one goes
// through the observing transport like any other success.
func (a *memberAPI) probeHealth(ctx context.Context) {
	ticker := time.NewTicker(healthProbeInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		pctx, cancel := context.WithTimeout(ctx, healthProbeTimeout)
		err := a.readyz(pctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			a.health.requestFailed(fmt.Errorf("health check GET /readyz failed: %w", err))
		}
	}
}

// maxReadyzBody bounds what the hub reads of a member's /readyz answer.
const maxReadyzBody = 64 << 10

// readyz asks the member's /readyz through the member's HTTP client (its
// credentials, dial guard and redirect refusal) and reads at most
// maxReadyzBody bytes of the answer. A failing answer is reported by the
// checks it lists (e.g. "etcd"), or by its status when it lists none.
func (a *memberAPI) readyz(ctx context.Context) error {
	u := a.client.Discovery().RESTClient().Get().AbsPath("/readyz").URL()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := a.httpClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxReadyzBody+1))
	switch {
	case err != nil:
		return fmt.Errorf("%s: reading the answer: %w", resp.Status, err)
	case len(body) > maxReadyzBody:
		return fmt.Errorf("%s: the answer is larger than %d bytes", resp.Status, maxReadyzBody)
	case resp.StatusCode != http.StatusOK:
		if checks := failedChecks(string(body)); len(checks) > 0 {
			return fmt.Errorf("failing checks: %s", strings.Join(checks, ", "))
		}
		return errors.New(resp.Status)
	}
	return nil
}

// failedCheck matches a failing check in kube-apiserver's /readyz body.
var failedCheck = regexp.MustCompile(`\[-\]([a-zA-Z0-9/_.-]{1,100}) failed`)

// failedChecks names the checks a /readyz body lists as failed (at most 20).
func failedChecks(body string) []string {
	var checks []string
	for _, m := range failedCheck.FindAllStringSubmatch(body, 20) {
		checks = append(checks, m[1])
	}
	return checks
}

// noRedirectTransport turns a redirect from a member's API server into an
// error: client-go's http.Client would follow it, and the authentication
// wrappers above this transport would add the member's credentials to the
// request sent to wherever the redirect points.
type noRedirectTransport struct{ next http.RoundTripper }

func (t *noRedirectTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil || resp.StatusCode < 300 || resp.StatusCode > 399 || resp.StatusCode == http.StatusNotModified {
		return resp, err
	}
	resp.Body.Close()
	where := "elsewhere"
	if loc, err := url.Parse(resp.Header.Get("Location")); err == nil && loc.Host != "" {
		where = qn(loc.Host)
	}
	return nil, fmt.Errorf("member API server answered %s, a redirect to %s; redirects are not followed", resp.Status, where)
}

func (t *noRedirectTransport) WrappedRoundTripper() http.RoundTripper { return t.next }

// refuseRedirect is the member http.Client's CheckRedirect; the transport
// already refuses redirects, this keeps a changed transport from following.
func refuseRedirect(*http.Request, []*http.Request) error {
	return errors.New("redirects from member API servers are not followed")
}
