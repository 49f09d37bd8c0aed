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

// maxEventMessage bounds an Event's message (conversion errors quote the
// offending JSON).
const maxEventMessage = 1024

// reject logs an object left out and records a Warning Event on it. The
// error stays out of Status: it may quote the spec, which only those who can
// read the object (and so its Events) should see.
func (s *Source) reject(ctx context.Context, k kindInfo, u *unstructured.Unstructured, err error) {
	s.log.Warn("object not distributed: its spec does not convert", "kind", k.name(),
		"namespace", u.GetNamespace(), "name", u.GetName(), "generation", u.GetGeneration())
	msg := fmt.Sprintf("not distributed to member istiods: %v", err)
	if len(msg) > maxEventMessage {
		msg = msg[:maxEventMessage-3] + "..."
	}
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s.%x", u.GetName(), now.UnixNano()),
			Namespace: u.GetNamespace(),
		},
		InvolvedObject: corev1.ObjectReference{
			APIVersion:      u.GetAPIVersion(),
			Kind:            u.GetKind(),
			Namespace:       u.GetNamespace(),
			Name:            u.GetName(),
			UID:             u.GetUID(),
			ResourceVersion: u.GetResourceVersion(),
		},
		Reason:              RejectedReason,
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
	if _, err := s.kube.CoreV1().Events(u.GetNamespace()).Create(ctx, ev, metav1.CreateOptions{}); err != nil && ctx.Err() == nil {
		s.log.Warn("recording the rejection Event failed", "kind", k.name(),
			"namespace", u.GetNamespace(), "name", u.GetName(), "err", err)
	}
}
