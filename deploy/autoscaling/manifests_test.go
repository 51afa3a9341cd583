package autoscaling_test

import (
	"regexp"
	"strings"
	"testing"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/infergate/infergate/capacity"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/manifest"
)

// These tests decode the examples into KEDA's and Kubernetes' own types, without the race detector (make
// test), and check that they scale a pool of the quickstart policy on the series infergate exports.

func quickstartPool(t *testing.T, model, pool string) {
	t.Helper()
	snap, err := policies.LoadFile("../../examples/quickstart/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, ok := snap.Model(model)
	if !ok {
		t.Fatalf("no model %s in the quickstart", model)
	}
	for _, p := range m.Pools {
		if p.Name == pool {
			return
		}
	}
	t.Fatalf("no pool %s of %s in the quickstart", pool, model)
}

var selectorRe = regexp.MustCompile(`^max\(infergate_pool_desired_replicas\{model="([^"]+)",pool="([^"]+)"\}\)$`)

func TestKEDAScaledObject(t *testing.T) {
	docs := manifest.DecodeAll(t, "keda-scaledobject.yaml")
	if len(docs) != 1 {
		t.Fatalf("%d documents", len(docs))
	}
	var so kedav1alpha1.ScaledObject
	manifest.StrictDecode(t, docs[0], &so)
	if so.Kind != "ScaledObject" || so.Spec.ScaleTargetRef == nil || so.Spec.ScaleTargetRef.Kind != "Deployment" {
		t.Fatalf("%+v", so)
	}
	if so.Spec.MinReplicaCount == nil || *so.Spec.MinReplicaCount < capacity.MinWarmPool {
		t.Errorf("minReplicaCount %v below the warm pool of %d", so.Spec.MinReplicaCount, capacity.MinWarmPool)
	}
	if len(so.Spec.Triggers) != 1 {
		t.Fatalf("triggers %+v", so.Spec.Triggers)
	}
	tr := so.Spec.Triggers[0]
	// AverageValue with threshold 1: the HPA's replicas = the metric's value, the desired count.
	if tr.Type != "prometheus" || tr.MetricType != autoscalingv2.AverageValueMetricType || tr.Metadata["threshold"] != "1" {
		t.Errorf("trigger %+v", tr)
	}
	m := selectorRe.FindStringSubmatch(tr.Metadata["query"])
	if m == nil {
		t.Fatalf("query %q does not read one pool's infergate_pool_desired_replicas", tr.Metadata["query"])
	}
	quickstartPool(t, m[1], m[2])
	if !strings.Contains(so.Spec.ScaleTargetRef.Name, m[2]) {
		t.Errorf("scales %s for pool %s", so.Spec.ScaleTargetRef.Name, m[2])
	}
}

func TestHPAOnTheExternalMetric(t *testing.T) {
	var hpa autoscalingv2.HorizontalPodAutoscaler
	var cm corev1.ConfigMap
	for _, doc := range manifest.DecodeAll(t, "hpa-external-metric.yaml") {
		switch doc["kind"] {
		case "HorizontalPodAutoscaler":
			manifest.StrictDecode(t, doc, &hpa)
		case "ConfigMap":
			manifest.StrictDecode(t, doc, &cm)
		default:
			t.Fatalf("unexpected kind %v", doc["kind"])
		}
	}
	if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas < capacity.MinWarmPool || len(hpa.Spec.Metrics) != 1 {
		t.Fatalf("%+v", hpa.Spec)
	}
	ext := hpa.Spec.Metrics[0].External
	if ext == nil || ext.Metric.Name != "infergate_pool_desired_replicas" || ext.Target.Type != autoscalingv2.AverageValueMetricType ||
		ext.Target.AverageValue == nil || ext.Target.AverageValue.Value() != 1 {
		t.Fatalf("metric %+v", hpa.Spec.Metrics[0])
	}
	labels := ext.Metric.Selector.MatchLabels
	quickstartPool(t, labels["model"], labels["pool"])
	// prometheus-adapter publishes that metric.
	var adapter struct {
		ExternalRules []struct {
			SeriesQuery  string `json:"seriesQuery"`
			MetricsQuery string `json:"metricsQuery"`
			Name         struct {
				As string `json:"as"`
			} `json:"name"`
			Resources struct {
				Namespaced *bool `json:"namespaced"`
			} `json:"resources"`
		} `json:"externalRules"`
	}
	if err := yaml.UnmarshalStrict([]byte(cm.Data["config.yaml"]), &adapter); err != nil {
		t.Fatal(err)
	}
	if len(adapter.ExternalRules) != 1 || adapter.ExternalRules[0].Name.As != ext.Metric.Name ||
		!strings.Contains(adapter.ExternalRules[0].SeriesQuery, ext.Metric.Name) || !strings.Contains(adapter.ExternalRules[0].MetricsQuery, "<<.LabelMatchers>>") {
		t.Errorf("adapter rules %+v", adapter)
	}
}
