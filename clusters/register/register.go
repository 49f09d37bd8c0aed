// Package register registers a member cluster with the hub as `istioctl
// create-remote-secret` does, but with the hub's least-privilege member
// RBAC (deploy/remote-member-rbac.yaml) and a short-lived, revocable token,
// and rotates that token make-before-break (docs/architecture.md §3.2).
//
// In the member it applies the RBAC and mints a token bound to a Secret of
// its own per generation; in the hub's home cluster it writes the remote
// Secret; with the hub's REST API it waits until the hub runs the new
// kubeconfig, Ready, on every answer for a settle window (the hub's
// replicas each run member clients), before it deletes the previous
// generation's Secret, which revokes the previous token.
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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	// HomeServer is the home cluster's API server as this command reaches
	// it: with Namespace and ClusterID it names a new registration's
	// credential lineage (see Lineage; "" when the Secret is printed).
	HomeServer string
	// Hub, if set, is asked until the member is Ready with the new
	// kubeconfig (required with Rotate); Wait bounds that. Its Settle
	// applies to rotations (and their undoing) only: a new registration
	// revokes nothing, so the first answer that shows it Ready will do.
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
	if o.TokenTTL > MaxTokenTTL {
		return fmt.Errorf("token TTL %s is longer than %s: a leaked token stays useful until it expires; rotate (hub register --rotate) instead of minting longer-lived tokens", o.TokenTTL, MaxTokenTTL)
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
	if o.Hub != nil {
		if err := o.Hub.Validate(); err != nil {
			return err
		}
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

// networkAnnotations sets AnnotationNetwork for RegisterAnnotated, from
// the Secret as read for each write: a concurrent change of another
// member's network in the same Secret is kept.
func networkAnnotations(id, network string) func(cur *corev1.Secret) map[string]string {
	return func(cur *corev1.Secret) map[string]string {
		return map[string]string{clusters.AnnotationNetwork: networkAnnotation(cur, id, network)}
	}
}

// networkAnnotation is the AnnotationNetwork value that gives id network
// and every other member of the Secret the network it has in cur (nil: a
// new Secret).
func networkAnnotation(cur *corev1.Secret, id, network string) string {
	nets := map[string]string{}
	if cur == nil {
		cur = &corev1.Secret{}
	}
	for k := range cur.Data {
		if k == id {
			continue
		}
		if nw := clusters.ConfirmedNetwork(cur.Annotations[clusters.AnnotationNetwork], k); nw != "" {
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
//     stays Ready on the old client meanwhile), with Rotate on every
//     answer for Hub.Settle;
//  5. with Rotate, only then are the older generations of the lineage
//     deleted, which revokes their tokens. A rotation the hub does not
//     take within Wait is undone (undoRotation): the previous kubeconfig
//     is written back and, once the hub runs it again, the new generation
//     deleted.
func Register(ctx context.Context, o Options) (*Result, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	prev, err := checkRegistration(ctx, o)
	if err != nil {
		return nil, err
	}
	member, err := kubernetes.NewForConfig(o.Member.Config)
	if err != nil {
		return nil, fmt.Errorf("member client: %w", err)
	}
	rbac, err := LoadMemberRBAC()
	if err != nil {
		return nil, err
	}
	legacy, err := grantMember(ctx, o, member, rbac, prev)
	if err != nil {
		return nil, err
	}
	toks, cred, err := mintCredential(ctx, o, member, rbac, prev)
	if err != nil {
		return nil, err
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
	if err := check(ctx, o.Member.Config, cred.Token, rbac.ServiceAccount.Namespace); err != nil {
		return undo(err)
	}
	o.progress("the new token works against the member's API server, which enforces %s for it", WritesPolicy)
	if o.Secrets == nil {
		return &Result{Credential: cred, Kubeconfig: kubeconfig}, nil
	}
	secret, err := writeRemoteSecret(ctx, o, kubeconfig)
	if err != nil {
		return undo(err)
	}
	res := &Result{Secret: secret, Credential: cred, Kubeconfig: kubeconfig}
	if o.Hub == nil {
		return res, nil
	}
	hub := *o.Hub
	if !o.Rotate {
		hub.Settle = 0 // nothing is revoked: one replica's word will do
	}
	wctx, cancel := context.WithTimeout(ctx, o.Wait)
	defer cancel()
	notReady, err := hub.waitReady(wctx, o.ClusterID, sha256Hex(kubeconfig))
	if o.Rotate { // a new member is Pending and Syncing first, as it should
		res.NotReady = notReady
	}
	if err != nil {
		if !o.Rotate {
			return res, fmt.Errorf("registered, but not seen Ready: %w", err)
		}
		return nil, undoRotation(context.WithoutCancel(ctx), o, &hub, prev.kubeconfig, toks, cred, err)
	}
	res.Verified = true
	if !o.Rotate {
		o.progress("the hub reports cluster %s Ready with the new kubeconfig", o.ClusterID)
		return res, nil
	}
	o.progress("the hub reports cluster %s Ready with the new kubeconfig on every answer for %s", o.ClusterID, hub.Settle)
	return res, finishRotation(ctx, o, toks, cred, rbac, member, legacy, res)
}

// mintCredential mints the member's new credential: a token of the member
// RBAC's ServiceAccount, in the lineage of the token the hub runs (prev),
// or a new lineage. toks can revoke or discard it.
func mintCredential(ctx context.Context, o Options, member kubernetes.Interface, rbac *MemberRBAC, prev *registered) (tokens, *Credential, error) {
	toks := tokens{client: member, sa: rbac.ServiceAccount, clusterID: o.ClusterID, lineage: Lineage(o.HomeServer, o.Namespace, o.ClusterID)}
	if prev != nil { // the lineage of the token the hub runs, however the home cluster is reached
		lineage, err := toks.lineageOf(ctx, prev.kubeconfig)
		if err != nil {
			return tokens{}, nil, fmt.Errorf("member (context %q): %w", o.Member.Context, err)
		}
		if lineage != "" {
			toks.lineage = lineage
		}
	}
	cred, err := toks.mint(ctx, o.TokenTTL)
	if err != nil {
		return tokens{}, nil, fmt.Errorf("member (context %q): %w", o.Member.Context, err)
	}
	o.progress("credential generation %d (lineage %s) minted, bound to Secret %s/%s, expires %s", cred.Generation, toks.lineage, rbac.ServiceAccount.Namespace, cred.Secret, cred.Expires.UTC().Format(time.RFC3339))
	if short := time.Until(cred.Expires); short < o.TokenTTL-time.Minute {
		o.progress("warning: the member's API server granted %s, not the %s asked for", short.Round(time.Second), o.TokenTTL)
	}
	return toks, cred, nil
}

// writeRemoteSecret writes the member's remote Secret with kubeconfig (and
// its network, if given) and returns its name. The home cluster's ID is
// refused before (checkRegistration) when the hub's API is given; without
// it the command cannot know it (the hub ignores such a key).
func writeRemoteSecret(ctx context.Context, o Options, kubeconfig []byte) (string, error) {
	var annotations func(cur *corev1.Secret) map[string]string
	if o.Network != "" {
		annotations = networkAnnotations(o.ClusterID, o.Network)
	}
	registrar := clusters.NewRegistrar(o.Secrets, o.Namespace, "", clusters.KubeconfigPolicy{})
	secret, _, err := registrar.RegisterAnnotated(ctx, o.ClusterID, kubeconfig, annotations)
	if err != nil {
		return "", err
	}
	o.progress("remote secret %s written", secret)
	return secret, nil
}

// checkRegistration reads the member's current registration (nil: none, or
// no Secrets to read it from) and refuses what cannot succeed before
// anything is made: registering a registered member, rotating an
// unregistered one, the hub's home cluster's ID, or a rotation a hub too
// old to report its kubeconfig could not confirm.
func checkRegistration(ctx context.Context, o Options) (*registered, error) {
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
		st, found, err := o.Hub.status(ctx, o.ClusterID)
		switch {
		case err != nil:
			return nil, fmt.Errorf("the hub's API: %w", err)
		case found && st.Secret == "": // the API lists the home cluster, from no Secret
			return nil, fmt.Errorf("cluster ID %s is the hub's home cluster (hub serve --cluster-id): a member needs an ID of its own", o.ClusterID)
		case found && o.Rotate && st.KubeconfigSHA256 == "":
			return nil, errors.New("the hub does not report which kubeconfig a member runs (kubeconfigSHA256): it is older than this command, and a rotation could revoke the credential it runs")
		}
	}
	return prev, nil
}

// grantMember applies the member RBAC when registering, and when rotating
// a credential of the legacy ServiceAccount (whose bindings then name both
// until finishRotation); it reports whether the credential prev holds is
// of that legacy ServiceAccount. Registering grants the member RBAC (an
// admin's right); a rotation only mints and revokes a token, so that
// whoever runs it (a CronJob) needs no right to write or list RBAC.
func grantMember(ctx context.Context, o Options, member kubernetes.Interface, rbac *MemberRBAC, prev *registered) (legacy bool, err error) {
	grant := rbac
	if prev != nil && rbac.ServiceAccount != legacyServiceAccount && tokenServiceAccount(prev.kubeconfig) == legacyServiceAccount {
		grant, legacy = rbac.withSubject(legacyServiceAccount), true
	}
	if o.Rotate && !legacy {
		o.progress("member RBAC left as registered (a rotation mints and revokes a token of %s, nothing more)", rbac.ServiceAccount)
		return false, nil
	}
	if err := grant.Apply(ctx, member); err != nil {
		return legacy, fmt.Errorf("member (context %q): %w", o.Member.Context, err)
	}
	o.progress("member RBAC applied (deploy/remote-member-rbac.yaml) for %s", rbac.ServiceAccount)
	if legacy {
		o.progress("the hub runs a token of %s: its bindings name it too until the hub runs %s's", legacyServiceAccount, rbac.ServiceAccount)
	}
	if others, err := rbac.OtherBindings(ctx, member); err != nil {
		o.progress("warning: could not check what else %s is granted: %v", rbac.ServiceAccount, err)
	} else if len(others) > 0 {
		o.progress("warning: %s is also bound by %s: its tokens may do more than deploy/remote-member-rbac.yaml grants", rbac.ServiceAccount, strings.Join(others, ", "))
	}
	return legacy, nil
}

// finishRotation, once the hub runs the new credential, revokes the older
// generations of its lineage into res and, when the credential replaced
// was of the legacy ServiceAccount, removes that from the member RBAC's
// bindings.
func finishRotation(ctx context.Context, o Options, toks tokens, cred *Credential, rbac *MemberRBAC, member kubernetes.Interface, legacy bool, res *Result) error {
	var err error
	res.Revoked, err = toks.revokeBefore(ctx, cred.Generation)
	if err != nil {
		return fmt.Errorf("rotated, but revoking the previous credential: %w", err)
	}
	o.progress("%d previous credential generation(s) revoked", res.Revoked)
	if res.Revoked == 0 {
		o.progress("the previous credential was not minted by hub register: revoke it where it was made")
	}
	if legacy {
		if err := rbac.Apply(ctx, member); err != nil {
			return fmt.Errorf("rotated, but removing %s from the member RBAC's bindings: %w", legacyServiceAccount, err)
		}
		o.progress("%s removed from the member RBAC's bindings: they name %s only", legacyServiceAccount, rbac.ServiceAccount)
	}
	return nil
}

// check proves a token authenticates at the member's API server and may
// do what the hub does first: list Services.
func check(ctx context.Context, operator *rest.Config, token, namespace string) error {
	cfg := rest.AnonymousClientConfig(operator)
	cfg.BearerToken = token
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("checking the new token: %w", err)
	}
	if _, err := c.CoreV1().Services("").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return fmt.Errorf("the new token does not list the member's Services: %w", err)
	}
	// The token is handed to nobody before the member's API server
	// enforces WritesPolicy for it: its admission plugin loads a policy a
	// moment after it is applied, and until then the token may write any
	// Service its Role allows. A dry-run write the policy forbids runs
	// admission and changes nothing.
	probe := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "hub-register-policy-probe"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "probe", Port: 1}}}}
	deadline := time.Now().Add(policyWait)
	for {
		_, err := c.CoreV1().Services(namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), WritesPolicy) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the member's API server does not enforce the admission policy %s for the new token after %s (a dry-run create of %s/%s it forbids: %v)",
				WritesPolicy, policyWait, namespace, probe.Name, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// WritesPolicy is the ValidatingAdmissionPolicy of
// deploy/remote-member-rbac.yaml that lets the member identity write only
// the hub's gateway Services; policyWait is how long a registration waits
// for the member's API server to enforce it.
const (
	WritesPolicy = "hub-remote-member-writes"
	policyWait   = 30 * time.Second
)

// undoRotation undoes a rotation the hub was not seen to take (why): the
// previous kubeconfig is written back and, once the hub is seen running
// it again (on every answer for hub.Settle, within o.Wait), the new
// generation is deleted. A replica may have switched to the new
// kubeconfig just after the last poll; deleting its token at once would
// revoke the client it runs while the restored one syncs. If the hub is
// not seen back on the previous kubeconfig, the new generation is kept
// and the error says so.
func undoRotation(ctx context.Context, o Options, hub *Hub, previous []byte, toks tokens, cred *Credential, why error) error {
	notTaken := fmt.Errorf("rotation not taken by the hub: %w", why)
	if err := restore(ctx, o.Secrets, o.ClusterID, previous); err != nil {
		return errors.Join(notTaken, fmt.Errorf("writing the previous kubeconfig back (credential generation %d, Secret %s/%s, is kept: the hub may run it): %w", cred.Generation, toks.sa.Namespace, cred.Secret, err))
	}
	o.progress("rotation not taken by the hub: the previous kubeconfig is written back; waiting for the hub to run it again")
	wctx, cancel := context.WithTimeout(ctx, o.Wait)
	defer cancel()
	if err := hub.waitRuns(wctx, o.ClusterID, sha256Hex(previous)); err != nil {
		return errors.Join(notTaken, fmt.Errorf("the previous kubeconfig is written back, but the hub was not seen running it again, so credential generation %d (Secret %s/%s) is kept, as a hub replica may still run it: once the hub reports the member on the previous kubeconfig, delete that Secret to revoke it, or rotate again: %w", cred.Generation, toks.sa.Namespace, cred.Secret, err))
	}
	if err := toks.discard(ctx, cred); err != nil {
		return errors.Join(fmt.Errorf("rotation not taken by the hub, the previous credential is written back and stays: %w", why), err)
	}
	return fmt.Errorf("rotation not taken by the hub, the previous credential is written back and stays (the new one is revoked): %w", why)
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
