package distribute

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// eventComponent is the source of the Events the Source records.
const eventComponent = "hub"

// maxEventNamePrefix bounds the object name an Event's name starts with
// (Event names are at most 253 bytes; a 16-digit stamp follows).
const maxEventNamePrefix = 200

// maxEventMessage bounds an Event's message (conversion errors quote the
// offending JSON).
const maxEventMessage = 1024

// refOf is the reference an Event names an object by.
func refOf(u *unstructured.Unstructured) corev1.ObjectReference {
	return corev1.ObjectReference{
		APIVersion:      u.GetAPIVersion(),
		Kind:            u.GetKind(),
		Namespace:       u.GetNamespace(),
		Name:            u.GetName(),
		UID:             u.GetUID(),
		ResourceVersion: u.GetResourceVersion(),
	}
}

// reject logs an object left out and records a Warning Event on it. A
// conversion error stays out of the log and of Status: it may quote the
// spec, which only those who can read the object (and so its Events)
// should see.
func (s *Source) reject(ctx context.Context, kind string, ref corev1.ObjectReference, generation int64, reason string, err error) {
	s.log.Warn("object not distributed", "kind", kind, "namespace", ref.Namespace, "name", ref.Name,
		"generation", generation, "reason", reason, "why", statusMessage(reason, err))
	_ = s.recordEvent(ctx, kind, ref, RejectedReason, fmt.Sprintf("not distributed to member istiods: %v", err)) // logged
}

// recordEvent records a Warning Event on an object, its message cut to
// maxEventMessage; a failure is logged and returned.
func (s *Source) recordEvent(ctx context.Context, kind string, ref corev1.ObjectReference, reason, msg string) error {
	if len(msg) > maxEventMessage {
		msg = msg[:maxEventMessage-3] + "..."
	}
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s.%x", ref.Name[:min(len(ref.Name), maxEventNamePrefix)], now.UnixNano()),
			Namespace: ref.Namespace,
		},
		InvolvedObject:      ref,
		Reason:              reason,
		Message:             msg,
		Type:                corev1.EventTypeWarning,
		Source:              corev1.EventSource{Component: eventComponent},
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
		ReportingController: eventComponent,
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := s.kube.CoreV1().Events(ref.Namespace).Create(ctx, ev, metav1.CreateOptions{})
	if err != nil && ctx.Err() == nil {
		s.log.Warn("recording an Event failed", "kind", kind, "reason", reason,
			"namespace", ref.Namespace, "name", ref.Name, "err", err)
	}
	return err
}
