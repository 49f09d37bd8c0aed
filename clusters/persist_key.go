package clusters

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
)

// Persisted views are authenticated: each manifest carries an HMAC-SHA256
// (viewKeyMAC) over everything a reader trusts (see viewMAC), keyed with 32
// random bytes in the Secret ViewKeySecret of the hub's namespace. Whoever
// may write the view ConfigMaps but not read that Secret cannot forge a
// view, nor move one member's view to another, nor alter one; the Secret
// is writable only with Secret rights in the namespace, which already give
// the remote kubeconfigs. There is no key rotation: a new key (delete the
// Secret, restart every replica) makes every view written before it
// unreadable once.
const (
	// ViewKeySecret holds the key that authenticates persisted views.
	ViewKeySecret = "hub-view-key"
	// viewKeySecretData is its data key: exactly viewKeyLen bytes.
	viewKeySecretData = "key"
	viewKeyLen        = 32

	// viewMACScheme names what viewMAC covers; a different scheme is a
	// different message, never a valid MAC.
	viewMACScheme = "hub-member-view-hmac-sha256-v1"
)

// errViewKeyMalformed marks a key Secret that exists but holds no usable
// key: not retried, and no view is restored or written until it is fixed.
var errViewKeyMalformed = errors.New("malformed")

// ensureViewKey returns the view key from the Secret ViewKeySecret, creating
// the Secret with a random key when it does not exist. When several replicas
// start at once, one creation wins and the others read its key. Errors
// never carry key material.
func ensureViewKey(ctx context.Context, secrets typedcorev1.SecretInterface, namespace string) ([]byte, error) {
	s, err := secrets.Get(ctx, ViewKeySecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		key := make([]byte, viewKeyLen)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("generating the view key: %w", err)
		}
		s = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: ViewKeySecret, Labels: map[string]string{"app.kubernetes.io/managed-by": "hub"}},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{viewKeySecretData: key},
		}
		created, cerr := secrets.Create(ctx, s, metav1.CreateOptions{})
		switch {
		case cerr == nil:
			s, err = created, nil
		case apierrors.IsAlreadyExists(cerr): // another replica was first: use its key
			s, err = secrets.Get(ctx, ViewKeySecret, metav1.GetOptions{})
		default:
			return nil, fmt.Errorf("creating Secret %s/%s: %w", namespace, ViewKeySecret, cerr)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("reading Secret %s/%s: %w", namespace, ViewKeySecret, err)
	}
	key := s.Data[viewKeySecretData]
	if len(key) != viewKeyLen {
		return nil, fmt.Errorf("the view key Secret %s/%s is %w: its data key %q holds %d bytes; want %d random bytes",
			namespace, ViewKeySecret, errViewKeyMalformed, viewKeySecretData, len(key), viewKeyLen)
	}
	return key, nil
}

// viewMAC is the lowercase hex HMAC-SHA256 under key of what a reader of a
// persisted view trusts: the scheme and codec format, the member ID, the
// API server the view was read from, when it was written, the SHA-256 of
// the view's JSON and of its compressed bytes (so a reader verifies before
// it decompresses). Every field is length-prefixed, so no two field lists
// give the same message.
func viewMAC(key []byte, m viewManifest) string {
	h := hmac.New(sha256.New, key)
	for _, f := range []string{viewMACScheme, strconv.Itoa(viewFormat), m.ID, m.Server,
		m.WrittenAt.UTC().Format(time.RFC3339Nano), m.SHA256, m.GzSHA256} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// viewManifest is what a manifest says about the view it names, all of it
// covered by its MAC.
type viewManifest struct {
	ID        string
	Server    string
	WrittenAt time.Time
	SHA256    string // of the JSON
	GzSHA256  string // of the compressed bytes
}

// verify checks mac against the manifest under key, in constant time.
func (m viewManifest) verify(key []byte, mac string) error {
	if mac == "" {
		return errors.New("it carries no MAC (written by a hub before views were authenticated, or not by a hub)")
	}
	if !hmac.Equal([]byte(viewMAC(key, m)), []byte(mac)) {
		return errors.New("its MAC does not match (altered, moved from another member, or written with another key)")
	}
	return nil
}
