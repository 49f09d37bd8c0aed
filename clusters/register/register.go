// Package register registers a member cluster with the hub as `istioctl
// create-remote-secret` does, but with the hub's least-privilege member
// RBAC (deploy/remote-member-rbac.yaml) and a short-lived, revocable token,
// and rotates that token make-before-break (docs/architecture.md §3.2).
//
// In the member it applies the RBAC and mints a token bound to a Secret of
// its own per generation; in the hub's home cluster it writes the remote
// Secret; with the hub's REST API it waits until the hub runs the new
// kubeconfig, Ready, before it deletes the previous generation's Secret,
// which revokes the previous token.
package register

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/retry"

	"github.com/hubmesh/hub/clusters"
)

// DefaultTokenTTL is how long a minted token is valid: two weeks. Run
// `hub register --rotate` weekly (a CronJob): a token is then never within
// the hub's default --expiry-warning (7 days) unless a rotation failed, and
// that warning (a CredentialExpiring Event, the dashboard badge, the
// HubMemberCredentialExpiresSoon alert) leaves a week to fix it before the
// member goes stale. A leaked token is useful for two weeks at most, and
// rotation revokes it at once anyway.
const DefaultTokenTTL = 14 * 24 * time.Hour

// Member is a member cluster as the operator reaches it.
type Member struct {
	// Context names the operator's kubeconfig context, for messages.
	Context string
	// Config is the operator's own access (kubectl's context): it applies
	// the RBAC, mints tokens and checks that a new token works.
	Config *rest.Config
	// Server, CAData and TLSServerName are what the written kubeconfig
	// dials: the API server as the hub reaches it, and the CA it checks.
	Server        string
	CAData        []byte
	TLSServerName string
}

// Options are one registration or rotation.
type Options struct {
	ClusterID string
	Member    Member
	// Network, if not empty, is written as the member's network
	// (clusters.AnnotationNetwork) on the remote Secret.
	Network  string
	TokenTTL time.Duration
	// Rotate replaces the credential of a registered member, make-before-
	// break; without it a member that is already registered is an error.
	Rotate bool
	// Secrets are the remote Secrets of the hub's home cluster, in
	// Namespace (--remote-secrets-namespace); nil writes nothing there
	// (the caller prints the Secret instead).
	Secrets   typedcorev1.SecretInterface
	Namespace string
	// Hub, if set, is asked until the member is Ready with the new
	// kubeconfig (required with Rotate); Wait bounds that.
	Hub  *Hub
	Wait time.Duration
	// Progress is told each step (never a credential); nil: silent.
	Progress func(format string, args ...any)
}

// Result is what a registration did.
type Result struct {
	Secret     string // namespace/name of the remote Secret
	Credential *Credential
	Kubeconfig []byte // as written; it holds the token
	// Revoked counts the previous generations deleted (with Rotate).
	Revoked int
	// NotReady are, with Rotate, the states other than Ready the hub
	// reported for the member while it switched (none, if seamless).
	NotReady []string
	// Verified says the hub reported the member Ready with this kubeconfig.
	Verified bool
}

// Validate checks the options that need no cluster.
func (o *Options) Validate() error {
	if err := clusters.ValidateClusterID(o.ClusterID); err != nil {
		return err
	}
	if o.Network != "" {
		if errs := validation.IsValidLabelValue(o.Network); len(errs) > 0 || strings.ContainsAny(o.Network, ",=") {
			return fmt.Errorf("network %q is not a label value: %s", o.Network, strings.Join(errs, "; "))
		}
	}
	if o.TokenTTL < MinTokenTTL {
		return fmt.Errorf("token TTL %s is shorter than the %s a member's API server grants", o.TokenTTL, MinTokenTTL)
	}
	if o.Secrets == nil && (o.Rotate || o.Hub != nil) {
		return errors.New("rotating, or waiting for the hub, needs the hub's cluster to write the remote Secret in")
	}
	if o.Hub != nil && o.Wait <= 0 {
		return fmt.Errorf("the wait for the hub must be positive, not %s", o.Wait)
	}
	if o.Rotate && o.Hub == nil {
		return errors.New("rotation needs the hub's API: the previous credential is revoked only once the hub is seen Ready with the new one")
	}
	if errs := validation.IsDNS1123Label(o.Namespace); len(errs) > 0 {
		return fmt.Errorf("namespace %q: %s", o.Namespace, strings.Join(errs, "; "))
	}
	return nil
}

func (o *Options) progress(format string, args ...any) {
	if o.Progress != nil {
		o.Progress(format, args...)
	}
}

// Kubeconfig builds the kubeconfig a remote Secret holds for a member (as
// `istioctl create-remote-secret` does: one cluster, user and context
// named after the cluster ID, an inline CA and token) and checks it with
// the hub's own sanitiser, so that the hub accepts what is written.
func Kubeconfig(id string, m Member, token string) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[id] = &clientcmdapi.Cluster{Server: m.Server, CertificateAuthorityData: m.CAData, TLSServerName: m.TLSServerName}
	cfg.AuthInfos[id] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[id] = &clientcmdapi.Context{Cluster: id, AuthInfo: id}
	cfg.CurrentContext = id
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("writing the kubeconfig: %w", err)
	}
	kc, err := clusters.ParseKubeconfig(data)
	if err != nil {
		return nil, fmt.Errorf("the hub would refuse the kubeconfig: %w", err)
	}
	if len(kc.Warnings) > 0 {
		return nil, fmt.Errorf("the hub would warn about the kubeconfig: %s", strings.Join(kc.Warnings, "; "))
	}
	return data, nil
}

// RemoteSecret is the remote Secret for one member as `hub register`
// writes it when the Secret is new.
func RemoteSecret(namespace, id string, kubeconfig []byte, network string) *corev1.Secret {
	s := &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{
			Name: clusters.RemoteSecretName(id), Namespace: namespace,
			Labels:      map[string]string{clusters.MultiClusterLabel: "true"},
			Annotations: map[string]string{"networking.istio.io/cluster": id},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{id: kubeconfig},
	}
	if network != "" {
		s.Annotations[clusters.AnnotationNetwork] = id + "=" + network
	}
	return s
}

// registered is the remote Secret that holds a cluster ID now.
type registered struct {
	secret     *corev1.Secret
	kubeconfig []byte
}

// find returns the remote Secret holding id (the oldest, as the hub
// decides a conflict), or nil.
func find(ctx context.Context, secrets typedcorev1.SecretInterface, id string) (*registered, error) {
	list, err := secrets.List(ctx, metav1.ListOptions{LabelSelector: clusters.MultiClusterLabel + "=true"})
	if err != nil {
		return nil, fmt.Errorf("listing remote secrets: %w", err)
	}
	var found *registered
	for i := range list.Items {
		s := &list.Items[i]
		kc, ok := s.Data[id]
		if !ok {
			continue
		}
		if found == nil || s.CreationTimestamp.Before(&found.secret.CreationTimestamp) ||
			s.CreationTimestamp.Equal(&found.secret.CreationTimestamp) && s.Name < found.secret.Name {
			found = &registered{secret: s, kubeconfig: kc}
		}
	}
	return found, nil
}

// networkAnnotation is the AnnotationNetwork value that gives id network
// and every other member of the Secret the network it had.
func networkAnnotation(cur string, keys []string, id, network string) string {
	nets := map[string]string{}
	for _, k := range keys {
		if k == id {
			continue
		}
		if nw := clusters.ConfirmedNetwork(cur, k); nw != "" {
			nets[k] = nw
		}
	}
	nets[id] = network
	var out []string
	for _, k := range slices.Sorted(maps.Keys(nets)) {
		out = append(out, k+"="+nets[k])
	}
	return strings.Join(out, ",")
}

// Register registers the member, or with Rotate replaces its credential:
//
//  1. the member RBAC is applied in the member and the next credential
//     generation minted there;
//  2. the new token is checked against the member's API server (it
//     authenticates and may list Services);
//  3. the kubeconfig, checked by the hub's own sanitiser, is written into
//     the remote Secret;
//  4. with a Hub, the hub is asked until it reports the member Ready with
//     that kubeconfig (it swaps clients make-before-break: the member
//     stays Ready on the old client meanwhile);
//  5. with Rotate, only then are the older generations deleted, which
//     revokes their tokens. A rotation the hub does not take within Wait
//     is undone: the previous kubeconfig is written back and the new
//     generation deleted.
func Register(ctx context.Context, o Options) (*Result, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	var prev *registered
	if o.Secrets != nil {
		var err error
		if prev, err = find(ctx, o.Secrets, o.ClusterID); err != nil {
			return nil, err
		}
	}
	switch {
	case prev != nil && !o.Rotate:
		return nil, fmt.Errorf("cluster %s is already registered by secret %s/%s: rotate its credential with --rotate", o.ClusterID, prev.secret.Namespace, prev.secret.Name)
	case prev == nil && o.Rotate:
		return nil, fmt.Errorf("cluster %s is not registered in namespace %s: nothing to rotate (register it first, without --rotate)", o.ClusterID, o.Namespace)
	}
	if o.Hub != nil { // before anything is made: the wait must be able to succeed
		if _, _, err := o.Hub.status(ctx, o.ClusterID); err != nil {
			return nil, fmt.Errorf("the hub's API: %w", err)
		}
	}
	member, err := kubernetes.NewForConfig(o.Member.Config)
	if err != nil {
		return nil, fmt.Errorf("member client: %w", err)
	}
	rbac, err := LoadMemberRBAC()
	if err != nil {
		return nil, err
	}
	if err := rbac.Apply(ctx, member); err != nil {
		return nil, fmt.Errorf("member (context %q): %w", o.Member.Context, err)
	}
	o.progress("member RBAC applied (deploy/remote-member-rbac.yaml) for %s", rbac.ServiceAccount)
	if others, err := rbac.OtherBindings(ctx, member); err != nil {
		o.progress("warning: could not check what else %s is granted: %v", rbac.ServiceAccount, err)
	} else if len(others) > 0 {
		o.progress("warning: %s is also bound by %s: its tokens may do more than deploy/remote-member-rbac.yaml grants", rbac.ServiceAccount, strings.Join(others, ", "))
	}
	toks := tokens{client: member, sa: rbac.ServiceAccount, clusterID: o.ClusterID}
	cred, err := toks.mint(ctx, o.TokenTTL)
	if err != nil {
		return nil, fmt.Errorf("member (context %q): %w", o.Member.Context, err)
	}
	o.progress("credential generation %d minted, bound to Secret %s/%s, expires %s", cred.Generation, rbac.ServiceAccount.Namespace, cred.Secret, cred.Expires.UTC().Format(time.RFC3339))
	if short := time.Until(cred.Expires); short < o.TokenTTL-time.Minute {
		o.progress("warning: the member's API server granted %s, not the %s asked for", short.Round(time.Second), o.TokenTTL)
	}
	undo := func(err error) (*Result, error) {
		if derr := toks.discard(context.WithoutCancel(ctx), cred); derr != nil {
			return nil, errors.Join(err, derr)
		}
		return nil, err
	}
	kubeconfig, err := Kubeconfig(o.ClusterID, o.Member, cred.Token)
	if err != nil {
		return undo(err)
	}
	if err := check(ctx, o.Member.Config, cred.Token); err != nil {
		return undo(err)
	}
	o.progress("the new token works against the member's API server")
	if o.Secrets == nil {
		return &Result{Credential: cred, Kubeconfig: kubeconfig}, nil
	}

	annotations := map[string]string{}
	if o.Network != "" {
		var cur string
		var keys []string
		if prev != nil {
			cur, keys = prev.secret.Annotations[clusters.AnnotationNetwork], slices.Collect(maps.Keys(prev.secret.Data))
		}
		annotations[clusters.AnnotationNetwork] = networkAnnotation(cur, keys, o.ClusterID, o.Network)
	}
	registrar := clusters.NewRegistrar(o.Secrets, o.Namespace, "", clusters.KubeconfigPolicy{})
	secret, _, err := registrar.RegisterAnnotated(ctx, o.ClusterID, kubeconfig, annotations)
	if err != nil {
		return undo(err)
	}
	o.progress("remote secret %s written", secret)
	res := &Result{Secret: secret, Credential: cred, Kubeconfig: kubeconfig}
	if o.Hub == nil {
		return res, nil
	}
	wctx, cancel := context.WithTimeout(ctx, o.Wait)
	defer cancel()
	notReady, err := o.Hub.waitReady(wctx, o.ClusterID, sha256Hex(kubeconfig))
	if o.Rotate { // a new member is Pending and Syncing first, as it should
		res.NotReady = notReady
	}
	if err != nil {
		if !o.Rotate {
			return res, fmt.Errorf("registered, but not seen Ready: %w", err)
		}
		// Back to what the hub still runs; the new token goes.
		if rerr := restore(context.WithoutCancel(ctx), o.Secrets, o.ClusterID, prev.kubeconfig); rerr != nil {
			return nil, errors.Join(fmt.Errorf("rotation not taken by the hub: %w", err), fmt.Errorf("writing the previous kubeconfig back: %w", rerr))
		}
		return undo(fmt.Errorf("rotation not taken by the hub, the previous credential is written back and stays: %w", err))
	}
	res.Verified = true
	o.progress("the hub reports cluster %s Ready with the new kubeconfig", o.ClusterID)
	if o.Rotate {
		res.Revoked, err = toks.revokeBefore(ctx, cred.Generation)
		if err != nil {
			return res, fmt.Errorf("rotated, but revoking the previous credential: %w", err)
		}
		o.progress("%d previous credential generation(s) revoked", res.Revoked)
		if res.Revoked == 0 {
			o.progress("the previous credential was not minted by hub register: revoke it where it was made")
		}
	}
	return res, nil
}

// check proves a token authenticates at the member's API server and may
// do what the hub does first: list Services.
func check(ctx context.Context, operator *rest.Config, token string) error {
	cfg := rest.AnonymousClientConfig(operator)
	cfg.BearerToken = token
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("checking the new token: %w", err)
	}
	if _, err := c.CoreV1().Services("").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return fmt.Errorf("the new token does not list the member's Services: %w", err)
	}
	return nil
}

// restore writes a member's previous kubeconfig back into whichever remote
// Secret holds it, as it was (it is not checked again: the hub runs it).
func restore(ctx context.Context, secrets typedcorev1.SecretInterface, id string, kubeconfig []byte) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := find(ctx, secrets, id)
		if err != nil {
			return err
		}
		if cur == nil {
			return fmt.Errorf("no remote secret holds cluster %s any more", id)
		}
		cur.secret.Data[id] = kubeconfig
		_, err = secrets.Update(ctx, cur.secret, metav1.UpdateOptions{})
		return err
	})
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
