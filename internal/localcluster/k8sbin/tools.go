//go:build tools

// Package k8sbin pins the Kubernetes and etcd versions that the local test
// clusters are built from. It is a separate module so that the hub's own
// go.mod never depends on k8s.io/kubernetes.
package k8sbin

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
