package web

import (
	"sync"
	"time"

	"github.com/hubmesh/hub/api"
)

// Bounds of the session store: an authenticated user signing in again and
// again replaces their own oldest session instead of growing the store, and
// the whole store never holds more than maxSessions.
const (
	maxSessions        = 10000
	maxSessionsPerUser = 32
	sweepEvery         = time.Minute
)

// Why a session ended, as live streams tell the browser (their "end" event).
const (
	endSignedOut = "signed out"
	endExpired   = "session expired"
	endRevoked   = "session revoked"
	endEvicted   = "too many newer sessions"
	endFull      = "too many sessions on the hub"
	// endDisplaced ends the oldest live stream of a session that opened
	// more than %d: that page stops updating, the newer ones go on.
	endDisplaced = "more than %d pages of this session are live; this one stopped updating"
)

// session is one signed-in browser. Its fields never change after sign-in;
// ended is closed when the session ends (sign-out, expiry, eviction,
// revocation) so that live streams stop at once, and *reason (set by the
// store when it adds the session) says why: it is written once, under the
// store's lock, before ended is closed, so it may be read after <-ended.
type session struct {
	id      string
	user    api.User
	csrf    string
	token   string // kept to re-check the session with the authenticator
	expires time.Time
	ended   chan struct{}
	reason  *string
}

// endReason waits for the session to end and says why.
func (s *session) endReason() string {
	<-s.ended
	return *s.reason
}

// sessionStore is a bounded map of sessions by ID. Expired sessions are
// dropped when looked up and by a sweep (at most once a minute, on use), so
// the map holds no dead entries for long and needs no goroutine.
type sessionStore struct {
	now func() time.Time

	mu        sync.Mutex
	byID      map[string]*session
	perUser   map[string]int
	lastSweep time.Time
}

func newSessionStore(now func() time.Time) *sessionStore {
	return &sessionStore{now: now, byID: map[string]*session{}, perUser: map[string]int{}, lastSweep: now()}
}

// add stores s, first making room: expired sessions go, then the user's
// oldest if they hold maxSessionsPerUser, then the oldest of all if full.
func (st *sessionStore) add(s *session) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if s.reason == nil {
		s.reason = new(string)
	}
	st.sweepLocked(true)
	if st.perUser[s.user.Name] >= maxSessionsPerUser {
		st.removeOldestLocked(endEvicted, func(o *session) bool { return o.user.Name == s.user.Name })
	}
	if len(st.byID) >= maxSessions {
		st.removeOldestLocked(endFull, func(*session) bool { return true })
	}
	st.byID[s.id] = s
	st.perUser[s.user.Name]++
}

// get returns the live session with this ID, or nil (an expired one is removed).
func (st *sessionStore) get(id string) *session {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.sweepLocked(false)
	s := st.byID[id]
	if s != nil && !st.now().Before(s.expires) {
		st.removeLocked(s, endExpired)
		return nil
	}
	return s
}

// remove ends the session with this ID, if any, for reason.
func (st *sessionStore) remove(id, reason string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if s := st.byID[id]; s != nil {
		st.removeLocked(s, reason)
	}
}

func (st *sessionStore) len() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.byID)
}

func (st *sessionStore) removeLocked(s *session, reason string) {
	delete(st.byID, s.id)
	if st.perUser[s.user.Name]--; st.perUser[s.user.Name] <= 0 {
		delete(st.perUser, s.user.Name)
	}
	*s.reason = reason
	close(s.ended)
}

func (st *sessionStore) removeOldestLocked(reason string, match func(*session) bool) {
	var oldest *session
	for _, s := range st.byID {
		if match(s) && (oldest == nil || s.expires.Before(oldest.expires)) {
			oldest = s
		}
	}
	if oldest != nil {
		st.removeLocked(oldest, reason)
	}
}

// sweepLocked drops expired sessions if a minute has passed since the last
// sweep (or always, when force is set and the store is full).
func (st *sessionStore) sweepLocked(force bool) {
	now := st.now()
	if now.Sub(st.lastSweep) < sweepEvery && !(force && len(st.byID) >= maxSessions) {
		return
	}
	st.lastSweep = now
	for _, s := range st.byID {
		if !now.Before(s.expires) {
			st.removeLocked(s, endExpired)
		}
	}
}
