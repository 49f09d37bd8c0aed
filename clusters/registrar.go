package clusters

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"
)

// InvalidError is a registration request the hub refuses; its message says why.
type InvalidError struct{ msg string }

func (e *InvalidError) Error() string { return e.msg }

func invalid(format string, args ...any) error { return &InvalidError{fmt.Sprintf(format, args...)} }

// Registrar registers and removes members by writing remote Secrets to the
// home cluster, exactly as an operator would with kubectl: the Registry then
// picks the change up like any other. It validates with the same sanitiser
// before writing anything.
type Registrar struct {
	secrets   typedcorev1.SecretInterface
	namespace string
	homeID    string
	policy    KubeconfigPolicy
}

// NewRegistrar creates a Registrar writing Secrets in namespace.
func NewRegistrar(secrets typedcorev1.SecretInterface, namespace, homeID string, policy KubeconfigPolicy) *Registrar {
	return &Registrar{secrets: secrets, namespace: namespace, homeID: homeID, policy: policy}
}

var nonNameChars = regexp.MustCompile(`[^a-z0-9.-]+`)

// RemoteSecretName is the Secret `istioctl create-remote-secret` would use
// for a cluster ID.
func RemoteSecretName(id string) string { return secretNameFor(id) }

// ConfirmedNetwork is the network a remote Secret's AnnotationNetwork
// value confirms for member id ("" when it names none for it).
func ConfirmedNetwork(annotation, id string) string { return confirmedNetwork(annotation, id) }

// secretNameFor is the Secret `istioctl create-remote-secret` would use.
func secretNameFor(id string) string {
	return "istio-remote-secret-" + strings.Trim(nonNameChars.ReplaceAllString(strings.ToLower(id), "-"), "-.")
}

// Register validates a cluster ID and kubeconfig, then sets that key in the
// remote Secret that already holds it, or creates istio-remote-secret-<id>.
// It returns the Secret (namespace/name) and whether the cluster is new.
func (g *Registrar) Register(ctx context.Context, id string, kubeconfig []byte) (secret string, created bool, err error) {
	return g.RegisterAnnotated(ctx, id, kubeconfig, nil)
}

// RegisterAnnotated is Register that also sets annotations on the remote
// Secret (e.g. AnnotationNetwork), in the same write; other annotations are
// left as they are. annotations is asked on every attempt with the Secret
// as just read (nil when it is created), so that a value merged from it
// (AnnotationNetwork names every member of the Secret) keeps a concurrent
// writer's change; nil sets none.
func (g *Registrar) RegisterAnnotated(ctx context.Context, id string, kubeconfig []byte, annotations func(cur *corev1.Secret) map[string]string) (secret string, created bool, err error) {
	if err := ValidateClusterID(id); err != nil {
		return "", false, invalid("%v", err)
	}
	if id == g.homeID {
		return "", false, invalid("cluster ID %q is the home cluster's own ID", id)
	}
	if _, err := g.policy.ParseKubeconfig(kubeconfig); err != nil {
		return "", false, invalid("%v", err)
	}
	owners, err := g.owners(ctx, id)
	if err != nil {
		return "", false, err
	}
	name := secretNameFor(id)
	if len(owners) > 0 {
		name = owners[0]
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := g.secrets.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			created = true
			s := &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{
					Name: name, Namespace: g.namespace,
					Labels:      map[string]string{MultiClusterLabel: "true"},
					Annotations: map[string]string{"networking.istio.io/cluster": id},
				},
				Data: map[string][]byte{id: kubeconfig},
			}
			if annotations != nil {
				maps.Copy(s.Annotations, annotations(nil))
			}
			_, err = g.secrets.Create(ctx, s, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		if cur.Labels[MultiClusterLabel] != "true" {
			return invalid("secret %s/%s exists but is not a remote secret (label %s=true missing)", g.namespace, name, MultiClusterLabel)
		}
		_, had := cur.Data[id]
		created = !had
		if cur.Data == nil {
			cur.Data = map[string][]byte{}
		}
		var set map[string]string
		if annotations != nil {
			set = annotations(cur)
		}
		cur.Data[id] = kubeconfig
		if len(set) > 0 && cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		maps.Copy(cur.Annotations, set)
		_, err = g.secrets.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		var inv *InvalidError
		if errors.As(err, &inv) {
			return "", false, err
		}
		return "", false, fmt.Errorf("writing remote secret %s/%s: %w", g.namespace, name, err)
	}
	return g.namespace + "/" + name, created, nil
}

// Remove deletes a cluster's key from every remote Secret that holds it,
// and a Secret that is left without keys. Removing an absent cluster is not
// an error.
func (g *Registrar) Remove(ctx context.Context, id string) error {
	if id == g.homeID {
		return invalid("the home cluster %q cannot be removed", id)
	}
	owners, err := g.owners(ctx, id)
	if err != nil {
		return err
	}
	for _, name := range owners {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := g.secrets.Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			if err != nil {
				return err
			}
			if _, ok := cur.Data[id]; !ok {
				return nil
			}
			if len(cur.Data) == 1 {
				err := g.secrets.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &cur.ResourceVersion}})
				if apierrors.IsNotFound(err) {
					return nil
				}
				return err
			}
			delete(cur.Data, id)
			_, err = g.secrets.Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			return fmt.Errorf("removing cluster %s from secret %s/%s: %w", id, g.namespace, name, err)
		}
	}
	return nil
}

// owners lists the remote Secrets that have a key for id.
func (g *Registrar) owners(ctx context.Context, id string) ([]string, error) {
	list, err := g.secrets.List(ctx, metav1.ListOptions{LabelSelector: MultiClusterLabel + "=true"})
	if err != nil {
		return nil, fmt.Errorf("listing remote secrets: %w", err)
	}
	var out []string
	for _, s := range list.Items {
		if _, ok := s.Data[id]; ok {
			out = append(out, s.Name)
		}
	}
	return out, nil
}
