//go:build tools

// Package helm pins the Helm version that the chart tests (charts/,
// e2e/chart_*_test.go) lint and render charts/hub with. It is a separate
// module so that the hub's own go.mod never depends on Helm.
package helm

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
