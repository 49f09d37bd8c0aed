package register

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// A member's credential is a short-lived token of the member RBAC's
// ServiceAccount (TokenRequest), bound to a Secret of its own in the
// ServiceAccount's namespace: one Secret per generation. Deleting that
// Secret revokes the token at once (the API server rejects a bound token
// whose object is gone), so a rotation revokes the previous generation
// instead of waiting for it to expire.
const (
	// LabelTokenFor on a generation's Secret is the cluster ID it was
	// minted for (a cluster ID is a valid label value).
	LabelTokenFor = "hub.federation/member-token-for"
	// LabelGeneration is the generation's number, 1, 2, ...
	LabelGeneration = "hub.federation/generation"
	// SecretTypeMemberToken is the generation Secrets' type: they hold no
	// data, they only exist while their token may be used.
	SecretTypeMemberToken corev1.SecretType = "hub.federation/member-token"
	// MinTokenTTL is the shortest TokenRequest the API server grants.
	MinTokenTTL = 10 * time.Minute
)

// Credential is one generation of a member's credential.
type Credential struct {
	Token      string    // never logged or printed unless asked
	Expires    time.Time // as the member's API server set it
	Generation int
	Secret     string // the bound Secret's name
}

// tokens mints and revokes the credentials of one cluster ID in a member.
type tokens struct {
	client    kubernetes.Interface
	sa        types.NamespacedName
	clusterID string
}

// generations lists the cluster ID's generation Secrets, oldest first.
func (t tokens) generations(ctx context.Context) ([]corev1.Secret, error) {
	list, err := t.client.CoreV1().Secrets(t.sa.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: labels.Set{LabelTokenFor: t.clusterID}.String(),
	})
	if err != nil {
		return nil, fmt.Errorf("listing the credential generations of %s in %s: %w", t.clusterID, t.sa.Namespace, err)
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
	bound, err := t.client.CoreV1().Secrets(t.sa.Namespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "hub-member-token-",
			Namespace:    t.sa.Namespace,
			Labels:       map[string]string{LabelTokenFor: t.clusterID, LabelGeneration: strconv.Itoa(next)},
			Annotations: map[string]string{
				"hub.federation/about": "the remote Secret of cluster " + t.clusterID + " holds a token of " + t.sa.String() + " bound to this Secret: deleting it revokes that token",
			},
		},
		Type: SecretTypeMemberToken,
	}, metav1.CreateOptions{FieldManager: fieldManager})
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
