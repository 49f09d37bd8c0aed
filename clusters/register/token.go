package register

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// A member's credential is a short-lived token of the member RBAC's
// ServiceAccount (TokenRequest), bound to a Secret of its own in the
// ServiceAccount's namespace: one Secret per generation. Deleting that
// Secret revokes the token at once (the API server rejects a bound token
// whose object is gone), so a rotation revokes the previous generation
// instead of waiting for it to expire.
//
// A member's generations form a lineage: those of one cluster ID as one
// hub knows it. Two hubs that register the same member under the same ID
// (a canary beside the main one) have a lineage each, so that a rotation
// for one never revokes the other's token. A new registration's lineage
// is a hash of the hub's home cluster (its API server as the command
// reaches it), the remote Secrets' namespace and the ID; a rotation
// continues the lineage of the token the remote Secret holds (its bound
// Secret says which), however the home cluster is reached this time.
// Generation n of a lineage is the Secret hub-member-token-<lineage>-<n>,
// created by that name: two rotations that would mint the same
// generation cannot both succeed.
const (
	// LabelTokenFor on a generation's Secret is the cluster ID it was
	// minted for (a cluster ID is a valid label value).
	LabelTokenFor = "hub.federation/member-token-for"
	// LabelLineage is the generation's lineage (16 hex digits).
	LabelLineage = "hub.federation/member-token-lineage"
	// LabelGeneration is the generation's number, 1, 2, ...
	LabelGeneration = "hub.federation/generation"
	// SecretTypeMemberToken is the generation Secrets' type: they hold no
	// data, they only exist while their token may be used.
	SecretTypeMemberToken corev1.SecretType = "hub.federation/member-token"
	// MinTokenTTL is the shortest TokenRequest the API server grants.
	MinTokenTTL = 10 * time.Minute
	// MaxTokenTTL is the longest token hub register mints: twice
	// DefaultTokenTTL. A leaked token is useful until it expires or is
	// revoked; longer lives are what rotation is for.
	MaxTokenTTL = 2 * DefaultTokenTTL
)

// Lineage is the lineage of a new registration of cluster id in the hub
// whose home cluster's API server is homeServer and whose remote Secrets
// are in namespace ("" for a Secret that is printed, not written).
func Lineage(homeServer, namespace, id string) string {
	sum := sha256.Sum256([]byte(homeServer + "\x00" + namespace + "\x00" + id))
	return hex.EncodeToString(sum[:8])
}

// Credential is one generation of a member's credential.
type Credential struct {
	Token      string    // never logged or printed unless asked
	Expires    time.Time // as the member's API server set it
	Generation int
	Secret     string // the bound Secret's name
}

// tokens mints and revokes the credentials of one lineage in a member.
type tokens struct {
	client    kubernetes.Interface
	sa        types.NamespacedName
	clusterID string
	lineage   string
}

// secretName is generation gen's Secret.
func (t tokens) secretName(gen int) string {
	return "hub-member-token-" + t.lineage + "-" + strconv.Itoa(gen)
}

// generations lists the lineage's generation Secrets, oldest first.
func (t tokens) generations(ctx context.Context) ([]corev1.Secret, error) {
	list, err := t.client.CoreV1().Secrets(t.sa.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: labels.Set{LabelTokenFor: t.clusterID, LabelLineage: t.lineage}.String(),
	})
	if err != nil {
		return nil, fmt.Errorf("listing the credential generations of %s (lineage %s) in %s: %w", t.clusterID, t.lineage, t.sa.Namespace, err)
	}
	items := slices.DeleteFunc(list.Items, func(s corev1.Secret) bool { return s.Type != SecretTypeMemberToken })
	slices.SortFunc(items, func(a, b corev1.Secret) int { return generationOf(a) - generationOf(b) })
	return items, nil
}

func generationOf(s corev1.Secret) int {
	n, _ := strconv.Atoi(s.Labels[LabelGeneration])
	return n
}

// mint creates the next generation: its Secret, then a token for the
// ServiceAccount bound to it, valid for ttl (or less if the API server
// caps it).
func (t tokens) mint(ctx context.Context, ttl time.Duration) (*Credential, error) {
	gens, err := t.generations(ctx)
	if err != nil {
		return nil, err
	}
	next := 1
	if len(gens) > 0 {
		next = generationOf(gens[len(gens)-1]) + 1
	}
	name := t.secretName(next)
	bound, err := t.client.CoreV1().Secrets(t.sa.Namespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: t.sa.Namespace,
			Labels:    map[string]string{LabelTokenFor: t.clusterID, LabelLineage: t.lineage, LabelGeneration: strconv.Itoa(next)},
			Annotations: map[string]string{
				"hub.federation/about": "the remote Secret of cluster " + t.clusterID + " holds a token of " + t.sa.String() + " bound to this Secret: deleting it revokes that token",
			},
		},
		Type: SecretTypeMemberToken,
	}, metav1.CreateOptions{FieldManager: fieldManager})
	if apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("credential generation %d of cluster %s exists already (Secret %s/%s): another hub register is registering or rotating it now; let that one finish, then run again", next, t.clusterID, t.sa.Namespace, name)
	}
	if err != nil {
		return nil, fmt.Errorf("creating the Secret of credential generation %d in %s: %w", next, t.sa.Namespace, err)
	}
	seconds := int64(ttl / time.Second)
	tr, err := t.client.CoreV1().ServiceAccounts(t.sa.Namespace).CreateToken(ctx, t.sa.Name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &seconds,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: bound.Name, UID: bound.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		_ = t.delete(context.WithoutCancel(ctx), *bound)
		return nil, fmt.Errorf("requesting a token for %s: %w", t.sa, err)
	}
	return &Credential{Token: tr.Status.Token, Expires: tr.Status.ExpirationTimestamp.Time, Generation: next, Secret: bound.Name}, nil
}

// revokeBefore deletes every generation older than gen, which revokes
// their tokens. It returns how many it deleted.
func (t tokens) revokeBefore(ctx context.Context, gen int) (int, error) {
	gens, err := t.generations(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range gens {
		if generationOf(s) >= gen {
			continue
		}
		if err := t.delete(ctx, s); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// discard deletes one generation (a credential that was not put to use).
func (t tokens) discard(ctx context.Context, c *Credential) error {
	s, err := t.client.CoreV1().Secrets(t.sa.Namespace).Get(ctx, c.Secret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading credential generation %d: %w", c.Generation, err)
	}
	return t.delete(ctx, *s)
}

func (t tokens) delete(ctx context.Context, s corev1.Secret) error {
	err := t.client.CoreV1().Secrets(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting credential generation %d (Secret %s/%s): %w", generationOf(s), s.Namespace, s.Name, err)
	}
	return nil
}

// lineageOf is the lineage of the generation a kubeconfig's token is bound
// to ("" if it is not a token of this lineage scheme: not a bound token of
// the ServiceAccount, or its Secret gone or not a generation of id). The
// token's claims are read, not verified: the kubeconfig comes from the
// remote Secret, and the bound Secret must exist with the UID they name.
func (t tokens) lineageOf(ctx context.Context, kubeconfig []byte) (string, error) {
	name, uid := boundSecret(kubeconfig, t.sa)
	if name == "" {
		return "", nil
	}
	s, err := t.client.CoreV1().Secrets(t.sa.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading the credential generation the current token is bound to (Secret %s/%s): %w", t.sa.Namespace, name, err)
	}
	lineage := s.Labels[LabelLineage]
	if string(s.UID) != uid || s.Type != SecretTypeMemberToken || s.Labels[LabelTokenFor] != t.clusterID || !validLineage(lineage) {
		return "", nil
	}
	return lineage, nil
}

func validLineage(s string) bool {
	if len(s) != 16 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// boundSecret is the Secret (name, UID) the token of a kubeconfig's
// current user is bound to, if it is a token of sa bound to a Secret.
func boundSecret(kubeconfig []byte, sa types.NamespacedName) (name, uid string) {
	c, ok := tokenClaims(kubeconfig)
	if !ok || c.Secret == nil || c.Namespace != sa.Namespace || c.ServiceAccount.Name != sa.Name {
		return "", ""
	}
	return c.Secret.Name, c.Secret.UID
}

// tokenServiceAccount is the ServiceAccount whose token a kubeconfig's
// current user holds, as the token claims it (unverified; zero if none).
func tokenServiceAccount(kubeconfig []byte) types.NamespacedName {
	c, ok := tokenClaims(kubeconfig)
	if !ok {
		return types.NamespacedName{}
	}
	return types.NamespacedName{Namespace: c.Namespace, Name: c.ServiceAccount.Name}
}

// serviceAccountClaims are the Kubernetes claims of a service-account token.
type serviceAccountClaims struct {
	Namespace string `json:"namespace"`
	Secret    *struct {
		Name string `json:"name"`
		UID  string `json:"uid"`
	} `json:"secret"`
	ServiceAccount struct {
		Name string `json:"name"`
	} `json:"serviceaccount"`
}

// tokenClaims reads (does not verify) the Kubernetes claims of the token of
// a kubeconfig's current user.
func tokenClaims(kubeconfig []byte) (serviceAccountClaims, bool) {
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		return serviceAccountClaims{}, false
	}
	kctx := cfg.Contexts[cfg.CurrentContext]
	if kctx == nil || cfg.AuthInfos[kctx.AuthInfo] == nil {
		return serviceAccountClaims{}, false
	}
	parts := strings.Split(cfg.AuthInfos[kctx.AuthInfo].Token, ".")
	if len(parts) != 3 {
		return serviceAccountClaims{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return serviceAccountClaims{}, false
	}
	var claims struct {
		Kubernetes serviceAccountClaims `json:"kubernetes.io"`
	}
	if json.Unmarshal(payload, &claims) != nil {
		return serviceAccountClaims{}, false
	}
	return claims.Kubernetes, true
}
