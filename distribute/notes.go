package distribute

import (
	"context"
	"errors"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// NoteReason is the reason of the Warning Event recorded on a distributed
// object that the hub's own xDS applies other than Istio means it (see
// Note).
const NoteReason = "HubXDSNote"

// Note says what the hub's own xDS does with part of a distributed object
// that its clients cannot do as Istio means it, e.g. an AuthorizationPolicy
// rule proxyless gRPC servers cannot enforce, which the hub makes fail
// closed. Status lists the notes; each is recorded as a Warning Event on
// its object once per version of the object and per leader (the record
// of what was recorded is the leader's memory).
type Note struct {
	Object  string `json:"object"` // namespace/name
	Message string `json:"message"`
}

// maxNotes bounds the notes kept per kind.
const maxNotes = 1000

// SetNotes replaces the notes on a kind's objects (see Note). The Events
// of new notes are recorded by Run's goroutine (never by the caller), by
// the replica that may write, a few per round; one that failed, or was
// due while this replica could not write, on a later round (every
// Options.Recheck).
func (s *Source) SetNotes(kind string, notes []Note) {
	notes = append([]Note(nil), notes...)
	sort.Slice(notes, func(i, j int) bool {
		if notes[i].Object != notes[j].Object {
			return notes[i].Object < notes[j].Object
		}
		return notes[i].Message < notes[j].Message
	})
	if len(notes) > maxNotes {
		notes = notes[:maxNotes]
	}
	s.mu.Lock()
	st := s.states[kind]
	if st == nil {
		s.mu.Unlock()
		return
	}
	st.notes = notes
	s.mu.Unlock()
	select {
	case s.noteKick <- struct{}{}:
	default: // a recording is due already
	}
}

// noteKey identifies a note reported on one version of its object.
type noteKey struct {
	kind, object, version, message string
}

// recordNotes records a Warning Event for each note not yet reported on
// its object's current version, when this replica may write.
func (s *Source) recordNotes(ctx context.Context) {
	if !s.mayWrite() {
		return
	}
	type due struct {
		key noteKey
		ref corev1.ObjectReference
	}
	var todo []due
	s.mu.Lock()
	current := map[noteKey]bool{}
	for _, name := range Kinds() {
		st := s.states[name]
		for _, n := range st.notes {
			o, ok := st.objects[n.Object]
			if !ok {
				if r, rejected := st.rejected[n.Object]; rejected && r.object != nil {
					o, ok = *r.object, true
				}
			}
			if !ok {
				continue
			}
			k := noteKey{name, n.Object, o.Version, n.Message}
			current[k] = true
			if !s.noted[k] {
				todo = append(todo, due{k, o.ref})
			}
		}
	}
	for k := range s.noted {
		if !current[k] {
			delete(s.noted, k) // forgotten: reported again should it come back
		}
	}
	s.mu.Unlock()
	if len(todo) > maxNoteEvents {
		todo = todo[:maxNoteEvents] // the rest on a later round
	}
	for _, d := range todo {
		if !s.mayWrite() {
			return // no longer the writer
		}
		err := s.recordEvent(ctx, d.key.kind, d.ref, NoteReason, "applied by the hub's xDS: "+d.key.message)
		if transient(err) {
			return // the API server is struggling: the whole round again later
		}
		s.mu.Lock()
		s.noted[d.key] = true // recorded, or refused for good (logged once)
		s.mu.Unlock()
	}
}

// transient reports whether an Event's creation may succeed if tried
// again later.
func transient(err error) bool {
	return err != nil && (apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || errors.Is(err, context.DeadlineExceeded))
}

// maxNoteEvents bounds the Events one round of recordNotes records (each
// is an API call on Run's goroutine).
const maxNoteEvents = 20
