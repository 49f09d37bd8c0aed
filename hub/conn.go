package hub

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/hubmesh/hub/hub/authn"
)

// conn is one ADS stream, SotW or Delta, as the hub holds it (docs/architecture.md
// §3.6): made by the stream's loop (serveStream), registered with the
// tracker while it is open, and handed to every watch of the stream, so
// that nothing looks a stream up by its node or its ID on the way from a
// request to a response. Its parts are owned as follows:
//   - id and out never change; out has a lock of its own;
//   - node, named (SotW only), trimmed, told and nonce are the loop's (no
//     lock), as is the per-type protocol state of sotwConn and deltaConn
//     that embed the conn;
//   - state is what the tracker checks and records (identity, status,
//     nonces sent, each type's state): the loop's too, through the tracker;
//   - shown is what others (the API, other streams' TypeSyncz) see of
//     state: immutable values the loop publishes after each change, read
//     without the stream's lock (it has none);
//   - rec is what the watcher's pushes read (identity, as the loop tells
//     it, persistent subscribers, the responses handed to the stream), guarded by
//     watcher.mu, but for its withheld-SDS log (a lock of its own) and
//     its per-type sent flags (atomic).
type conn struct {
	id  int64   // unique across the hub's listeners (Hub.streamIDs)
	out *outbox // where the stream's watches put their responses

	node  *corev3.Node // the first node the stream sent (an empty one until then)
	named bool         // node is the client's
	// trimmed is the node trimNode last trimmed: each node once.
	trimmed *corev3.Node
	// told is the identity the watcher was last told (identified).
	told  authn.Identity
	nonce int64 // the last response's nonce

	state streamState
	shown shownStream
	rec   streamRecord
}

func newConn(id int64) *conn {
	return &conn{id: id, out: newOutbox(), node: &corev3.Node{}, rec: streamRecord{subs: map[string]*subscriber{}}}
}

// trimNode drops what the hub never reads of the stream's node
// (forgetUnread), once per node: the stream's loop stamps every request
// with the stream's node, and trimming allocates.
func (c *conn) trimNode() {
	if c.node != c.trimmed {
		forgetUnread(c.node)
		c.trimmed = c.node
	}
}

// identified tells the watcher the stream's verified identity when the
// tracker settled a new one (on the first request, and on a Delta request
// with another node): an SDS subscriber of another member or namespace
// than before is aimed again (watcher.identify).
func (c *conn) identified(w *watcher) {
	if c.state.ident != c.told {
		w.identify(&c.rec, c.state.ident)
		c.told = c.state.ident
	}
}

// unpublishHeld withdraws what the stream published it holds, when the
// loop releases its holdings (the stream ends): a released holding may be
// another stream's to change.
func (c *conn) unpublishHeld() {
	for _, t := range c.state.types {
		t.held.Store(nil)
	}
}
