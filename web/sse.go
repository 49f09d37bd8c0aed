package web

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// sseWriteTimeout bounds each write of a live stream: a browser that stops
// reading is cut off instead of holding the stream forever. The server's
// WriteTimeout cannot apply to a stream that lasts for hours.
const sseWriteTimeout = 15 * time.Second

// events streams a page's content as Server-Sent Events whenever it changes.
// The stream re-checks its session on every tick (Config.Refresh, at most
// 5s) and ends at once on sign-out: it ends with an "end" event saying why
// when the session is signed out, expires, is revoked or is evicted by newer
// sessions, or when a newer stream of the session displaced it (see
// liveStreams), and without one (so the browser reconnects) when the
// session cannot be checked right now or the server shuts down. When the
// hub holds its maximum of streams it answers 503.
func (d *Dashboard) events(w http.ResponseWriter, r *http.Request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	name, id, ok := livePage(r.URL.Query().Get("page"))
	if !ok {
		http.Error(w, "unknown page", http.StatusBadRequest)
		return
	}
	s := sessionOf(r)
	live, err := d.live.open(s.id)
	if err != nil {
		d.cfg.Log.Warn("refusing a live stream", "user", s.user.Name, "limit", d.cfg.MaxLiveStreams)
		w.Header().Set("Retry-After", "30")
		http.Error(w, "the hub has too many live pages open; reload later", http.StatusServiceUnavailable)
		return
	}
	defer d.live.close(s.id, live)
	write, ok := openEventStream(w, flusher)
	if !ok {
		return
	}
	end := func(reason string) { write(func(w io.Writer) { writeEvent(w, "end", reason) }) }
	var last string
	lastWrite := time.Now()
	tick := time.NewTicker(d.cfg.Refresh)
	defer tick.Stop()
	for {
		data, _ := d.data(r, name, id)
		var buf bytes.Buffer
		if err := d.tmpl.ExecuteTemplate(&buf, name+"-content", data); err != nil {
			d.cfg.Log.Error("rendering a live update", "page", name, "error", err)
			return
		}
		switch html := buf.String(); {
		case html != last:
			last = html
			if !write(func(w io.Writer) { writeEvent(w, "update", html) }) {
				return
			}
			lastWrite = time.Now()
		case time.Since(lastWrite) >= d.cfg.Heartbeat:
			if !write(func(w io.Writer) { _, _ = io.WriteString(w, ":\n\n") }) {
				return
			}
			lastWrite = time.Now()
		}
		select {
		case <-r.Context().Done():
			return
		case <-d.stop:
			return
		case <-s.ended:
			end(s.endReason())
			return
		case <-live.displaced:
			end(fmt.Sprintf(endDisplaced, d.cfg.MaxLiveStreamsPerSession))
			return
		case <-tick.C:
		}
		if goOn, ended := d.recheckLive(r.Context(), s); !goOn {
			if ended {
				end(s.endReason())
			}
			return
		}
	}
}

// openEventStream starts a Server-Sent Events response: the server's read
// and write timeouts are for ordinary requests and this one lasts, so it
// lifts them and bounds each write instead. write sends one frame and says
// whether it reached the client; false: the response cannot be a stream.
func openEventStream(w http.ResponseWriter, flusher http.Flusher) (write func(frame func(io.Writer)) bool, ok bool) {
	rc := http.NewResponseController(w)
	if err := rc.SetReadDeadline(time.Time{}); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return nil, false
	}
	write = func(frame func(io.Writer)) bool {
		if err := rc.SetWriteDeadline(time.Now().Add(sseWriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return false
		}
		frame(w)
		return rc.Flush() == nil
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	flusher.Flush()
	return write, true
}

// livePage is the page (and its object's ID) a live stream of path shows;
// false for a path that is no page.
func livePage(path string) (name, id string, ok bool) {
	switch {
	case path == "/":
		return "overview", "", true
	case path == "/clusters" || path == "/services" || path == "/proxies" || path == "/trust" || path == "/distribution":
		return strings.TrimPrefix(path, "/"), "", true
	case strings.HasPrefix(path, "/clusters/"):
		return "cluster", strings.TrimPrefix(path, "/clusters/"), true
	case strings.HasPrefix(path, "/proxies/"):
		return "proxy", strings.TrimPrefix(path, "/proxies/"), true
	}
	return "", "", false
}

// recheckLive checks, on every tick of a live stream, that its session
// still exists and has not expired, and that its token still authenticates
// and may read (a session the store no longer holds has ended, here or in
// another request). The stream goes on, or ends: with an end event when
// the session ended, without one (the browser reconnects) when it cannot be
// checked now.
func (d *Dashboard) recheckLive(ctx context.Context, s *session) (goOn, ended bool) {
	if d.sessions.get(s.id) == nil {
		return false, true
	}
	_, err := d.recheck(ctx, s)
	switch {
	case errors.Is(err, errSessionEnded):
		d.cfg.Log.Info("dashboard session ended", "user", s.user.Name, "reason", err)
		d.sessions.remove(s.id, endRevoked)
		return false, true
	case err != nil:
		d.cfg.Log.Warn("re-checking a live stream's session; closing the stream", "user", s.user.Name, "error", err)
		return false, false
	}
	return true, false
}

// sseEscaper keeps every line terminator of the data inside its data: line.
// The data is HTML, so a carriage return becomes a character reference
// (which browsers read back as the same character); newlines split the data
// into data: lines, which the browser joins with newlines again.
var sseEscaper = strings.NewReplacer("\r", "&#13;")

// writeEvent writes one Server-Sent Event. Neither the event name nor the
// data can end a line early: SSE ends lines at \r, \n and \r\n, so a \r from
// the data (say, in a cluster's status message) could otherwise start a
// field of its own (event:, id:, retry:).
func writeEvent(w io.Writer, event, data string) {
	var b strings.Builder
	b.WriteString("event: ")
	b.WriteString(strings.NewReplacer("\r", "", "\n", "").Replace(event))
	b.WriteString("\n")
	for line := range strings.SplitSeq(sseEscaper.Replace(data), "\n") {
		b.WriteString("data: ")
		b.WriteString(line)
		b.WriteString("\n")
	}
	b.WriteString("\n")
	_, _ = io.WriteString(w, b.String())
}
