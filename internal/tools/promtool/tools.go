//go:build tools

// Package promtool pins the Prometheus version that promtool, which checks
// and unit-tests the Helm chart's alert rules
// (charts/hub/files/prometheus-rules.yaml), is built from. It is a separate
// module so that the hub's own go.mod never depends on
// github.com/prometheus/prometheus.
package promtool

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
