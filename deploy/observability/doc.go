// Package observability holds infergate's Prometheus alerting and recording rules (rules.yaml, with promtool unit
// tests in rules_test.yaml), its Grafana dashboard (dashboard.json) and the Prometheus Operator resources
// (prometheus-operator.yaml). Its Go code only reads those files: DashboardSeries and RuleSeries list the metric
// names they query, so that a test can compare them against what a running infergate exports.
package observability
