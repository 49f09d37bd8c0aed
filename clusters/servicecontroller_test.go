package clusters

import (
	"log/slog"
	"testing"
)

// TestStoppedControllerLeavesTheSink: once a member's client is stopped
// (a successor replaced it, or it is removed), what its queue still holds
// is dropped, not handed to the Sink: the caller of stop decides what the
// Sink keeps. The queued Service here is gone from its (empty) cache, so
// handing it over would remove it from the Sink.
func TestStoppedControllerLeavesTheSink(t *testing.T) {
	sink := newRecordingSink()
	key := ServiceKey{Namespace: "default", Name: "a"}
	sink.UpdateService("west", key, &Service{Namespace: key.Namespace, Name: key.Name, Endpoints: []Endpoint{{Address: "10.0.0.1", Port: 80}}})
	in := viewInputs{services: emptyServices, health: newMemberHealth(0), net: &networkController{}}
	sc := newServiceController("west", sink, slog.New(slog.DiscardHandler), in)
	sc.enqueue(key)
	sc.stop()
	sc.run() // returns: the queue is shut down
	if sink.services["west"][key] == nil {
		t.Fatal("a stopped controller handed a queued Service to the Sink (removed it)")
	}

	// The same, not stopped: the Service is removed, as it is gone.
	sc = newServiceController("west", sink, slog.New(slog.DiscardHandler), in)
	sc.enqueue(key)
	if !sc.processNext() || sink.services["west"][key] != nil {
		t.Fatal("a running controller did not hand the Sink the removal of a Service gone from its cache")
	}
	sc.stop()
}
