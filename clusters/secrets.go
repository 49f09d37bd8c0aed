package clusters

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// TLS material keys a Secret may carry (Kubernetes TLS secrets, and Istio's
// generic form for credentialName).
var tlsKeys = []string{"tls.crt", "tls.key", "ca.crt", "cert", "key", "cacert"}

// Secret types that never hold credentialName material; not even their
// metadata is cached (the same exclusions istiod makes).
var ignoredSecretTypes = []corev1.SecretType{
	corev1.SecretTypeServiceAccountToken, corev1.SecretTypeDockercfg, corev1.SecretTypeDockerConfigJson,
	corev1.SecretTypeBootstrapToken, "helm.sh/release.v1",
}

// TLSSecret is the TLS material of one Secret in a member cluster, as PEM.
// Any field may be empty. It must never be logged or rendered.
type TLSSecret struct {
	// Cert and Key are tls.crt/tls.key, or cert/key for generic secrets.
	Cert, Key []byte
	// CA is ca.crt, or cacert for generic secrets.
	CA []byte
}

// Errors of the Registry's lookups: TLSSecret, and the member a
// credential or stream names (IdentityScope, activeCluster).
var (
	ErrUnknownCluster   = errors.New("unknown cluster")
	ErrSecretNotFound   = errors.New("secret not found")
	ErrSecretsNotSynced = errors.New("secrets of this cluster are not synced yet")
)

// secretController caches the TLS material of a member's Secrets for SDS.
// One informer watches every Secret except the types above, and its
// transform keeps only the TLS keys, so memory stays small and no other
// secret data is held. It is deliberately separate from the endpoint
// controller's informers: a member whose credentials may not read Secrets
// still federates its endpoints.
type secretController struct {
	factory informers.SharedInformerFactory
	lister  corelisters.SecretLister
	synced  cache.InformerSynced
	inf     cache.SharedIndexInformer
}

func newSecretController(client kubernetes.Interface, onChange func(ServiceKey)) (*secretController, error) {
	var selectors []fields.Selector
	for _, t := range ignoredSecretTypes {
		selectors = append(selectors, fields.OneTermNotEqualSelector("type", string(t)))
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.AndSelectors(selectors...).String()
	}))
	inf := factory.Core().V1().Secrets().Informer()
	if err := inf.SetTransform(stripSecret); err != nil {
		return nil, fmt.Errorf("setting secret transform: %w", err)
	}
	s := &secretController{factory: factory, lister: factory.Core().V1().Secrets().Lister(), inf: inf}
	notify := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if sec, ok := obj.(*corev1.Secret); ok && onChange != nil {
			onChange(ServiceKey{Namespace: sec.Namespace, Name: sec.Name})
		}
	}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: notify, UpdateFunc: func(_, o any) { notify(o) }, DeleteFunc: notify,
	})
	if err != nil {
		return nil, fmt.Errorf("watching secrets: %w", err)
	}
	s.synced = reg.HasSynced
	return s, nil
}

func (s *secretController) get(key ServiceKey) (*TLSSecret, error) {
	if !s.synced() {
		return nil, ErrSecretsNotSynced
	}
	sec, err := s.lister.Secrets(key.Namespace).Get(key.Name)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w: %s", ErrSecretNotFound, key)
	}
	if err != nil {
		return nil, fmt.Errorf("reading secret %s: %w", key, err)
	}
	pick := func(keys ...string) []byte {
		for _, k := range keys {
			if v := sec.Data[k]; len(v) > 0 {
				return v
			}
		}
		return nil
	}
	return &TLSSecret{Cert: pick("tls.crt", "cert"), Key: pick("tls.key", "key"), CA: pick("ca.crt", "cacert")}, nil
}

// stripSecret keeps only a Secret's identity and its TLS keys.
func stripSecret(obj any) (any, error) {
	sec, ok := obj.(*corev1.Secret)
	if !ok {
		return obj, nil
	}
	out := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: sec.Name, Namespace: sec.Namespace, ResourceVersion: sec.ResourceVersion, UID: sec.UID},
		Type:       sec.Type,
	}
	for _, k := range tlsKeys {
		if v, ok := sec.Data[k]; ok {
			if out.Data == nil {
				out.Data = map[string][]byte{}
			}
			out.Data[k] = v
		}
	}
	return out, nil
}

// CanListSecrets asks a member's API server (SubjectAccessReview) whether a
// service account may list Secrets in a namespace, as istiod does before
// serving a Secret of another namespace over SDS.
func (r *Registry) CanListSecrets(ctx context.Context, cluster, saNamespace, saName, namespace string) (bool, error) {
	c, err := r.activeCluster(cluster)
	if err != nil {
		return false, err
	}
	sar, err := c.api.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   "system:serviceaccount:" + saNamespace + ":" + saName,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + saNamespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: namespace, Verb: "list", Resource: "secrets",
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("subject access review in cluster %s: %w", cluster, err)
	}
	return sar.Status.Allowed, nil
}

// TokenAudience is the audience a proxy's service-account token must carry,
// as istiod requires (istio-agent requests its token with it).
const TokenAudience = "istio-ca"

// RunsMeshAccount reports whether a mesh pod (labelled
// security.istio.io/tlsMode=istio) of member cluster runs as
// namespace/serviceAccount: the accounts whose workloads ask the hub's CA
// for certificates (authn.MeshAccounts).
func (r *Registry) RunsMeshAccount(cluster, namespace, serviceAccount string) bool {
	c, err := r.activeCluster(cluster)
	return err == nil && c.ns.runsMeshAccount(namespace, serviceAccount)
}

// ReviewToken checks a proxy's service-account token with a TokenReview in
// the member cluster the proxy says it runs in, and returns the service
// account it authenticates. A token of one member never authenticates in
// another (bound tokens name a service account UID that only exists in the
// cluster that issued them).
func (r *Registry) ReviewToken(ctx context.Context, cluster, token string) (namespace, serviceAccount string, err error) {
	c, err := r.activeCluster(cluster)
	if err != nil {
		return "", "", err
	}
	audiences := []string{TokenAudience}
	tr, err := c.api.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", "", fmt.Errorf("token review in cluster %s: %w", cluster, err)
	}
	if !tr.Status.Authenticated {
		reason := tr.Status.Error
		if reason == "" {
			reason = "not authenticated"
		}
		return "", "", fmt.Errorf("%w: cluster %s: %s", ErrTokenRejected, cluster, reason)
	}
	// As istiod: the answer must say the token is for one of the
	// audiences asked for. An API server that authenticates it without
	// (one that ignores spec.audiences, or answers for a token of its own
	// audience) proves nothing about the CA's audience.
	if !slices.ContainsFunc(tr.Status.Audiences, func(a string) bool { return slices.Contains(audiences, a) }) {
		return "", "", fmt.Errorf("%w: cluster %s: the token's audiences %q do not include %q", ErrTokenRejected, cluster, truncateList(tr.Status.Audiences), TokenAudience)
	}
	parts := strings.Split(tr.Status.User.Username, ":")
	if len(parts) != 4 || parts[0] != "system" || parts[1] != "serviceaccount" || parts[2] == "" || parts[3] == "" {
		return "", "", fmt.Errorf("%w: cluster %s: %q is not a service account", ErrTokenRejected, cluster, tr.Status.User.Username)
	}
	// As istiod: the username alone could come from another authenticator
	// (a static token file may name any user); the API server puts only
	// service-account tokens in this group.
	if !slices.Contains(tr.Status.User.Groups, "system:serviceaccounts") {
		return "", "", fmt.Errorf("%w: cluster %s: %q is not in group system:serviceaccounts", ErrTokenRejected, cluster, tr.Status.User.Username)
	}
	return parts[2], parts[3], nil
}

// truncateList bounds what a member's answer puts in an error: at most 8
// audiences of at most 64 bytes each.
func truncateList(list []string) []string {
	out := make([]string, 0, min(len(list), 8))
	for i, s := range list {
		if i == 8 {
			out = append(out, "…")
			break
		}
		out = append(out, truncateName(s))
	}
	return out
}

// ErrTokenRejected means a member cluster did not authenticate a token.
var ErrTokenRejected = errors.New("token rejected")
