package clusters

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"
)

// A member's persisted view lives in ConfigMaps of the home cluster's
// --namespace, all labelled viewLabel=<member key> (the unpadded lowercase
// base32 SHA-256 of the cluster ID, so that no two IDs share objects and
// every name and label value is valid):
//
//   - the manifest hub-member-view-<key> names the content's SHA-256 (and
//     that of its compressed bytes), when it was written, the API server it
//     was read from and how many chunks hold it, with an HMAC over all of
//     it (persist_key.go); a small view (at most one chunk) is inline in
//     the manifest itself;
//   - a larger one is in chunks hub-member-view-<key>-<version>-<n>, where
//     version is a prefix of the content's SHA-256.
//
// A write puts the new chunks first, then switches the manifest, then
// deletes chunks of other versions; a reader takes only chunks of the
// manifest's version and checks the whole against the manifest's SHA-256,
// so an interrupted write leaves the previous view readable.
const (
	viewLabel        = "hub.federation/member-view"
	viewRoleLabel    = "hub.federation/member-view-role" // viewRoleManifest or viewRoleChunk
	viewVersionLabel = "hub.federation/member-view-version"
	viewClusterLabel = "hub.federation/cluster" // the member ID, for people and kubectl
	viewRoleManifest = "manifest"
	viewRoleChunk    = "chunk"

	viewKeyData      = "view.json.gz" // binaryData: the compressed view (inline) or one chunk of it
	viewKeySHA256    = "sha256"       // hex SHA-256 of the uncompressed view
	viewKeyChunks    = "chunks"       // 0: inline; else the number of chunks
	viewKeyWrittenAt = "writtenAt"    // RFC 3339 (nanoseconds)
	viewKeyBytes     = "bytes"        // uncompressed size
	viewKeyIndex     = "index"        // a chunk's position
	viewKeyServer    = "server"       // the member's API server the view was read from
	viewKeyGzSHA256  = "gzSHA256"     // hex SHA-256 of the compressed view (all chunks)
	viewKeyMAC       = "hmacSHA256"   // viewMAC of the manifest, hex

	// defaultChunkSize keeps every object well below the API server's 1 MiB
	// ConfigMap limit.
	defaultChunkSize = 700 << 10
	viewNamePrefix   = "hub-member-view-"
	versionLen       = 32 // hex characters of the SHA-256 that name a version
)

var memberKeyEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// memberKey is the collision-free, name-safe key of a cluster ID.
func memberKey(id string) string {
	sum := sha256.Sum256([]byte(id))
	return strings.ToLower(memberKeyEncoding.EncodeToString(sum[:]))
}

func manifestName(id string) string { return viewNamePrefix + memberKey(id) }

func chunkName(id, version string, i int) string {
	return fmt.Sprintf("%s-%s-%d", manifestName(id), version, i)
}

// storedView is one member's view as read from the home cluster, still
// compressed and not yet authenticated (see open).
type storedView struct {
	viewManifest
	MAC string
	// Manifest names the manifest ConfigMap, for Events about the view.
	Manifest *corev1.ObjectReference
	gz       []byte
}

// open authenticates the view under key, then decompresses, decodes and
// validates it (validateView, with at most maxServices services). Its error
// says why the view is refused; unauthenticated tells a view that fails its
// MAC (or when there is no key) from one whose authenticated content is
// invalid.
func (v *storedView) open(key []byte, now time.Time, maxServices int) (services []*Service, unauthenticated bool, err error) {
	if key == nil {
		return nil, true, errors.New("the view key is unavailable, so no view can be authenticated")
	}
	if err := v.verify(key, v.MAC); err != nil {
		return nil, true, err
	}
	gzSum := sha256.Sum256(v.gz)
	if got := hex.EncodeToString(gzSum[:]); got != v.GzSHA256 {
		return nil, true, fmt.Errorf("its compressed content has SHA-256 %s; its manifest says %s", got, v.GzSHA256)
	}
	if services, err = v.services(); err != nil {
		return nil, false, err
	}
	if err := validateView(services, now, maxServices); err != nil {
		return nil, false, fmt.Errorf("invalid view: %w", err)
	}
	return services, false, nil
}

// services decompresses and decodes the view, checking its SHA-256.
func (v *storedView) services() ([]*Service, error) {
	raw, err := decompress(v.gz)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(raw)
	if got := fmt.Sprintf("%x", sum); got != v.SHA256 {
		return nil, fmt.Errorf("member view content has SHA-256 %s; its manifest says %s", got, v.SHA256)
	}
	return decodeView(raw)
}

// viewStore reads and writes persisted views in one namespace.
type viewStore struct {
	cms       typedcorev1.ConfigMapInterface
	chunkSize int
}

// writeResult says what one write did.
type writeResult struct {
	Skipped    bool // the stored view already had this content
	Bytes      int  // uncompressed
	Compressed int
	Objects    int // ConfigMaps that hold the view (manifest and chunks)
}

// write stores content (the encoding of a member's view, with SHA-256 sum,
// read from API server server), authenticated with key, unless the stored
// view already has that content from that server under a valid MAC.
// Conflicts are retried.
func (s *viewStore) write(ctx context.Context, key []byte, id string, content []byte, sum, server string, at time.Time) (writeResult, error) {
	gz := compress(content)
	gzSum := sha256.Sum256(gz)
	manifest := viewManifest{ID: id, Server: server, WrittenAt: at, SHA256: sum, GzSHA256: hex.EncodeToString(gzSum[:])}
	parts := splitChunks(gz, s.chunkSize)
	res := writeResult{Bytes: len(content), Compressed: len(gz), Objects: 1}
	if len(parts) > 1 {
		res.Objects += len(parts)
	}
	version := sum[:versionLen]
	name := manifestName(id)
	// Chunks to prune can exist only when this write or the manifest it
	// replaces has chunks, or when there was no manifest (an interrupted
	// first write may have left some): a single-object view replacing
	// another costs two requests.
	prune := len(parts) > 1
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur, err := s.cms.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			cur = nil
			prune = true
		case err != nil:
			return fmt.Errorf("reading %s: %w", name, err)
		case cur.Labels[viewVersionLabel] != "":
			prune = true
		}
		switch {
		case cur == nil:
		case cur.Data[viewKeySHA256] == sum && cur.Data[viewKeyServer] == server && manifestValid(key, id, cur):
			res.Skipped = true // another replica (or an earlier term) wrote it
			return nil
		}
		if len(parts) > 1 {
			for i, p := range parts {
				if err := s.putChunk(ctx, id, version, i, p); err != nil {
					return err
				}
			}
		}
		m := s.object(id, name, viewRoleManifest)
		m.Data = map[string]string{
			viewKeySHA256: sum, viewKeyWrittenAt: at.UTC().Format(time.RFC3339Nano),
			viewKeyBytes: strconv.Itoa(len(content)), viewKeyChunks: "0", viewKeyServer: server,
			viewKeyGzSHA256: manifest.GzSHA256, viewKeyMAC: viewMAC(key, manifest),
		}
		if len(parts) > 1 {
			m.Data[viewKeyChunks] = strconv.Itoa(len(parts))
			m.Labels[viewVersionLabel] = version
		} else {
			m.BinaryData = map[string][]byte{viewKeyData: gz}
		}
		if cur == nil {
			_, err = s.cms.Create(ctx, m, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(schema.GroupResource{Resource: "configmaps"}, name, err)
			}
		} else {
			m.ResourceVersion = cur.ResourceVersion
			_, err = s.cms.Update(ctx, m, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
		return nil
	})
	if err != nil || res.Skipped || !prune {
		return res, err
	}
	return res, s.pruneChunks(ctx, id)
}

func (s *viewStore) object(id, name, role string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name: name,
		Labels: map[string]string{
			viewLabel: memberKey(id), viewRoleLabel: role, viewClusterLabel: id,
			"app.kubernetes.io/managed-by": "hub",
		},
	}}
}

// putChunk creates chunk i of a version, or overwrites one left behind by
// an interrupted write (same name, so same content).
func (s *viewStore) putChunk(ctx context.Context, id, version string, i int, data []byte) error {
	name := chunkName(id, version, i)
	c := s.object(id, name, viewRoleChunk)
	c.Labels[viewVersionLabel] = version
	c.Data = map[string]string{viewKeyIndex: strconv.Itoa(i)}
	c.BinaryData = map[string][]byte{viewKeyData: data}
	_, err := s.cms.Create(ctx, c, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		err = retry.RetryOnConflict(retry.DefaultBackoff, func() error {
			cur, err := s.cms.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			c.ResourceVersion = cur.ResourceVersion
			_, err = s.cms.Update(ctx, c, metav1.UpdateOptions{})
			return err
		})
	}
	if err != nil {
		return fmt.Errorf("writing chunk %s: %w", name, err)
	}
	return nil
}

// pruneChunks deletes a member's chunks that the manifest does not name,
// as the manifest stands now (so a write by another replica in between
// keeps its chunks).
func (s *viewStore) pruneChunks(ctx context.Context, id string) error {
	keep := ""
	m, err := s.cms.Get(ctx, manifestName(id), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("reading %s: %w", manifestName(id), err)
	default:
		keep = m.Labels[viewVersionLabel]
	}
	return s.deleteChunks(ctx, id, keep)
}

// deleteChunks deletes a member's chunks of every version but keep.
func (s *viewStore) deleteChunks(ctx context.Context, id, keep string) error {
	list, err := s.cms.List(ctx, metav1.ListOptions{LabelSelector: viewLabel + "=" + memberKey(id) + "," + viewRoleLabel + "=" + viewRoleChunk})
	if err != nil {
		return fmt.Errorf("listing chunks of the view of %s: %w", id, err)
	}
	var errs []error
	for _, c := range list.Items {
		if keep != "" && c.Labels[viewVersionLabel] == keep {
			continue
		}
		if err := s.cms.Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting chunk %s: %w", c.Name, err))
		}
	}
	return errors.Join(errs...)
}

// delete removes a member's persisted view: the manifest first, so that no
// reader sees a partial view, then every chunk.
func (s *viewStore) delete(ctx context.Context, id string) error {
	if err := s.cms.Delete(ctx, manifestName(id), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting %s: %w", manifestName(id), err)
	}
	return s.deleteChunks(ctx, id, "")
}

// readAll reads every persisted view in the namespace with one list, by
// cluster ID. A view that cannot be assembled (missing chunks, a foreign
// object) is reported in errs and left out.
func (s *viewStore) readAll(ctx context.Context) (map[string]*storedView, []error, error) {
	return s.read(ctx, viewLabel)
}

// readOne reads one member's persisted view (nil if there is none).
func (s *viewStore) readOne(ctx context.Context, id string) (*storedView, error) {
	views, errs, err := s.read(ctx, viewLabel+"="+memberKey(id))
	if err != nil {
		return nil, err
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return views[id], nil
}

func (s *viewStore) read(ctx context.Context, selector string) (map[string]*storedView, []error, error) {
	// One list is one consistent snapshot: a manifest and the chunks it
	// names are seen together, whatever a writer is doing meanwhile.
	list, err := s.cms.List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, nil, fmt.Errorf("listing persisted member views: %w", err)
	}
	type parts struct {
		manifest *corev1.ConfigMap
		chunks   map[string]map[int][]byte // version → index → data
	}
	byKey := map[string]*parts{}
	for i := range list.Items {
		cm := &list.Items[i]
		key := cm.Labels[viewLabel]
		p := byKey[key]
		if p == nil {
			p = &parts{chunks: map[string]map[int][]byte{}}
			byKey[key] = p
		}
		switch cm.Labels[viewRoleLabel] {
		case viewRoleManifest:
			p.manifest = cm
		case viewRoleChunk:
			idx, err := strconv.Atoi(cm.Data[viewKeyIndex])
			if err != nil {
				continue
			}
			v := cm.Labels[viewVersionLabel]
			if p.chunks[v] == nil {
				p.chunks[v] = map[int][]byte{}
			}
			p.chunks[v][idx] = cm.BinaryData[viewKeyData]
		}
	}
	out := map[string]*storedView{}
	var errs []error
	for key, p := range byKey {
		if p.manifest == nil {
			continue // chunks of an interrupted first write, or of a deleted view
		}
		v, err := assemble(key, p.manifest, p.chunks)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[v.ID] = v
	}
	return out, errs, nil
}

func assemble(key string, m *corev1.ConfigMap, chunks map[string]map[int][]byte) (*storedView, error) {
	id := m.Labels[viewClusterLabel]
	if memberKey(id) != key || m.Name != manifestName(id) {
		return nil, fmt.Errorf("persisted view %s does not belong to cluster %q", m.Name, id)
	}
	manifest, err := parseManifest(id, m)
	if err != nil {
		return nil, err
	}
	v := &storedView{viewManifest: manifest, MAC: m.Data[viewKeyMAC], Manifest: &corev1.ObjectReference{
		Kind: "ConfigMap", APIVersion: "v1", Namespace: m.Namespace, Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion}}
	n, err := strconv.Atoi(m.Data[viewKeyChunks])
	if err != nil || n < 0 {
		return nil, fmt.Errorf("persisted view of %s: bad chunk count %q", id, m.Data[viewKeyChunks])
	}
	if n == 0 {
		v.gz = m.BinaryData[viewKeyData]
		return v, nil
	}
	version := m.Labels[viewVersionLabel]
	for i := range n {
		data, ok := chunks[version][i]
		if !ok {
			return nil, fmt.Errorf("persisted view of %s: chunk %d of %d (version %s) is missing", id, i, n, version)
		}
		v.gz = append(v.gz, data...)
	}
	return v, nil
}

// parseManifest reads what the manifest m of member id says of its view.
func parseManifest(id string, m *corev1.ConfigMap) (viewManifest, error) {
	at, err := time.Parse(time.RFC3339Nano, m.Data[viewKeyWrittenAt])
	if err != nil {
		return viewManifest{}, fmt.Errorf("persisted view of %s: bad %s: %w", id, viewKeyWrittenAt, err)
	}
	return viewManifest{ID: id, Server: m.Data[viewKeyServer], WrittenAt: at,
		SHA256: m.Data[viewKeySHA256], GzSHA256: m.Data[viewKeyGzSHA256]}, nil
}

// manifestValid reports whether the manifest m of member id carries a valid
// MAC under key.
func manifestValid(key []byte, id string, m *corev1.ConfigMap) bool {
	manifest, err := parseManifest(id, m)
	return err == nil && manifest.verify(key, m.Data[viewKeyMAC]) == nil
}
