package helm

import (
	"bytes"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"gopkg.in/yaml.v3"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/manifest"
)

const chartDir = "infergate"

// rendered is every object the chart renders, decoded strictly into its real API type.
type rendered struct {
	deployments     []*appsv1.Deployment
	services        []*corev1.Service
	configMaps      []*corev1.ConfigMap
	secrets         []*corev1.Secret
	serviceAccounts []*corev1.ServiceAccount
	pdbs            []*policyv1.PodDisruptionBudget
	roles           []*rbacv1.Role
	bindings        []*rbacv1.RoleBinding
	netpols         []*networkingv1.NetworkPolicy
	claims          []*corev1.PersistentVolumeClaim
	monitors        []*monitoringv1.ServiceMonitor
	rules           []*monitoringv1.PrometheusRule
	scaled          []*kedav1alpha1.ScaledObject
	hpas            []*autoscalingv2.HorizontalPodAutoscaler
}

func values(t *testing.T, file string) map[string]any {
	t.Helper()
	if file == "" {
		return map[string]any{}
	}
	v, err := chartutil.ReadValuesFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// render runs `helm template` through the SDK and decodes the output.
func render(t *testing.T, valuesFile string) rendered {
	t.Helper()
	return renderIn(t, valuesFile, nil)
}

// renderIn renders as an install or upgrade does against a cluster whose objects the provider serves to the
// templates' lookup (nil: none, as `helm template` sees).
func renderIn(t *testing.T, valuesFile string, cluster engine.ClientProvider) rendered {
	t.Helper()
	return renderNS(t, valuesFile, "infergate", cluster)
}

// renderNS renders the release into namespace ns.
func renderNS(t *testing.T, valuesFile, ns string, cluster engine.ClientProvider) rendered {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	rv, err := chartutil.ToRenderValues(chrt, values(t, valuesFile), chartutil.ReleaseOptions{Name: "infergate", Namespace: ns,
		IsInstall: true, Revision: 1}, caps)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]string
	if cluster == nil {
		out, err = engine.Render(chrt, rv)
	} else {
		out, err = engine.RenderWithClientProvider(chrt, rv, cluster)
	}
	if err != nil {
		t.Fatal(err)
	}
	var r rendered
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range out {
			if !yield(k) {
				return
			}
		}
	}) {
		dec := yaml.NewDecoder(strings.NewReader(out[name]))
		for {
			var doc map[string]any
			if err := dec.Decode(&doc); err != nil {
				if err.Error() == "EOF" {
					break
				}
				t.Fatalf("%s: %v", name, err)
			}
			if doc == nil {
				continue
			}
			r.add(t, name, doc)
		}
	}
	return r
}

func (r *rendered) add(t *testing.T, where string, doc map[string]any) {
	t.Helper()
	var into any
	switch doc["kind"] {
	case "Deployment":
		d := &appsv1.Deployment{}
		r.deployments, into = append(r.deployments, d), d
	case "Service":
		s := &corev1.Service{}
		r.services, into = append(r.services, s), s
	case "ConfigMap":
		c := &corev1.ConfigMap{}
		r.configMaps, into = append(r.configMaps, c), c
	case "Secret":
		s := &corev1.Secret{}
		r.secrets, into = append(r.secrets, s), s
	case "ServiceAccount":
		s := &corev1.ServiceAccount{}
		r.serviceAccounts, into = append(r.serviceAccounts, s), s
	case "PodDisruptionBudget":
		p := &policyv1.PodDisruptionBudget{}
		r.pdbs, into = append(r.pdbs, p), p
	case "Role":
		x := &rbacv1.Role{}
		r.roles, into = append(r.roles, x), x
	case "RoleBinding":
		x := &rbacv1.RoleBinding{}
		r.bindings, into = append(r.bindings, x), x
	case "NetworkPolicy":
		x := &networkingv1.NetworkPolicy{}
		r.netpols, into = append(r.netpols, x), x
	case "PersistentVolumeClaim":
		x := &corev1.PersistentVolumeClaim{}
		r.claims, into = append(r.claims, x), x
	case "ServiceMonitor":
		x := &monitoringv1.ServiceMonitor{}
		r.monitors, into = append(r.monitors, x), x
	case "PrometheusRule":
		x := &monitoringv1.PrometheusRule{}
		r.rules, into = append(r.rules, x), x
	case "ScaledObject":
		x := &kedav1alpha1.ScaledObject{}
		r.scaled, into = append(r.scaled, x), x
	case "HorizontalPodAutoscaler":
		x := &autoscalingv2.HorizontalPodAutoscaler{}
		r.hpas, into = append(r.hpas, x), x
	default:
		t.Fatalf("%s: unexpected kind %v", where, doc["kind"])
	}
	manifest.StrictDecode(t, doc, into)
}

func (r rendered) infergate(t *testing.T) *appsv1.Deployment {
	t.Helper()
	for _, d := range r.deployments {
		if d.Name == "infergate" {
			return d
		}
	}
	t.Fatal("no infergate Deployment")
	return nil
}

func TestLint(t *testing.T) {
	for _, file := range []string{"", "testdata/everything.yaml"} {
		l := lint.All(chartDir, values(t, file), "infergate", false)
		for _, m := range l.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("helm lint (%q): %s", file, m)
			}
		}
	}
}

func TestDefaultValues(t *testing.T) {
	r := render(t, "")
	d := r.infergate(t)
	chrt, _ := loader.Load(chartDir)
	c := d.Spec.Template.Spec.Containers[0]
	if c.Image != "ghcr.io/infergate/infergate:"+chrt.Metadata.AppVersion {
		t.Errorf("image %s: pinned to the appVersion, never latest", c.Image)
	}
	pod := d.Spec.Template.Spec.SecurityContext
	sc := c.SecurityContext
	if pod == nil || pod.RunAsNonRoot == nil || !*pod.RunAsNonRoot || sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("security context: pod %+v container %+v", pod, sc)
	}
	// mTLS by default, so kubelet probes the HTTP health paths (its gRPC probes cannot speak TLS).
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.String() != "metrics" {
			t.Errorf("%s probe %+v: HTTP health on the metrics port", name, p)
		}
	}
	if !mounted(c, "/etc/infergate/tls") || secretNamed(r, "infergate-tls") == nil || secretNamed(r, "infergate-envoy-client") == nil ||
		configMapNamed(r, "infergate-ca") == nil {
		t.Errorf("mTLS by default: mounted %v, secrets %d, config maps %d", mounted(c, "/etc/infergate/tls"), len(r.secrets), len(r.configMaps))
	}
	if len(d.Spec.Template.Spec.TopologySpreadConstraints) != 1 || len(r.pdbs) != 1 || len(r.services) != 1 || len(r.serviceAccounts) != 1 {
		t.Errorf("spread %v, PDBs %d, services %d, service accounts %d", d.Spec.Template.Spec.TopologySpreadConstraints, len(r.pdbs), len(r.services), len(r.serviceAccounts))
	}
	if len(r.monitors)+len(r.rules)+len(r.netpols)+len(r.scaled)+len(r.hpas) != 0 || len(r.secrets) != 2 || len(r.configMaps) != 2 {
		t.Errorf("optional objects rendered by default: secrets %d, config maps %d", len(r.secrets), len(r.configMaps))
	}
	// The rendered policy is valid, and every Service it discovers is covered by a Role.
	pol := configMapNamed(r, "infergate-policy")
	if pol == nil {
		t.Fatal("no policy ConfigMap")
	}
	snap, err := policies.Parse("configmap/policy.yaml", []byte(pol.Data["policy.yaml"]))
	if err != nil {
		t.Fatalf("the rendered policy: %v", err)
	}
	for _, ref := range snap.Services() {
		if !hasRole(r, ref.Namespace, "infergate") {
			t.Errorf("no Role to watch EndpointSlices in %s", ref.Namespace)
		}
	}
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"serve", "--policy=/etc/infergate/policy/policy.yaml", "--extproc-addr=:9002", "--instance-id=$(POD_NAME)",
		"--tls-cert=/etc/infergate/tls/tls.crt", "--tls-client-ca=/etc/infergate/tls/ca.crt", "--xds-secret-nodes=infergate-envoy-client"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %s", args, want)
		}
	}
	if strings.Contains(args, "--region") || strings.Contains(args, "--redis") {
		t.Errorf("args %q name a region or a Redis by default", args)
	}
}

// hasRole says whether infergate's ServiceAccount (in the release's namespace) may watch ns's EndpointSlices.
func hasRole(r rendered, ns, release string) bool {
	for _, role := range r.roles {
		if role.Namespace != ns || len(role.Rules) != 1 {
			continue
		}
		rule := role.Rules[0]
		if reflect.DeepEqual(rule.APIGroups, []string{"discovery.k8s.io"}) && reflect.DeepEqual(rule.Resources, []string{"endpointslices"}) &&
			reflect.DeepEqual(rule.Verbs, []string{"get", "list", "watch"}) {
			for _, b := range r.bindings {
				if b.Namespace == ns && b.RoleRef.Name == role.Name && len(b.Subjects) == 1 && b.Subjects[0].Name == "infergate" && b.Subjects[0].Namespace == release {
					return true
				}
			}
		}
	}
	return false
}

func TestEverythingOn(t *testing.T) {
	r := render(t, "testdata/everything.yaml")
	d := r.infergate(t)
	c := d.Spec.Template.Spec.Containers[0]
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--redis-addr=infergate-redis.infergate.svc:6379", "--tls-client-ca=/etc/infergate/tls/ca.crt",
		"--xds-secret-nodes=llm-gateway-envoy", "--region=eu-west"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %s", args, want)
		}
	}
	if c.Image != "ghcr.io/infergate/infergate:0.1.0-rc.1" {
		t.Errorf("image %s", c.Image)
	}
	// With TLS kubelet probes the HTTP health paths.
	if c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness %+v", c.ReadinessProbe)
	}
	// The chart's Redis: a Deployment and the Service the address names.
	var redisSvc bool
	for _, s := range r.services {
		redisSvc = redisSvc || s.Name == "infergate-redis"
	}
	if len(r.deployments) != 2 || !redisSvc {
		t.Errorf("deployments %d, redis service %v", len(r.deployments), redisSvc)
	}
	checkRedisHardened(t, r, c)
	// Fallback keys: a Secret mounted where apiKeyFrom: file:/etc/infergate/keys/<name> reads it.
	keys := secretNamed(r, "infergate-fallback-keys")
	if keys == nil || keys.StringData["together"] != "test-key" || !mounted(c, "/etc/infergate/keys") {
		t.Errorf("fallback keys: %+v", r.secrets)
	}
	checkSecretsReadable(t, r)
	for _, ns := range []string{"inference", "batch"} {
		if !hasRole(r, ns, "infergate") {
			t.Errorf("no EndpointSlice Role in %s", ns)
		}
	}
	if len(r.monitors) != 1 || r.monitors[0].Spec.Endpoints[0].Port != "http-metrics" || len(r.rules) != 1 || len(r.rules[0].Spec.Groups) == 0 {
		t.Errorf("monitoring: %d service monitors, %d rules", len(r.monitors), len(r.rules))
	}
	if np := netpolNamed(r, "infergate"); np == nil || len(np.Spec.Ingress) != 2 {
		t.Errorf("network policy %+v", r.netpols)
	}
	if len(r.scaled) != 2 || *r.scaled[0].Spec.MinReplicaCount != 2 || r.scaled[0].Spec.Triggers[0].Metadata["query"] !=
		`max(infergate_pool_desired_replicas{model="llama-3.1-8b",pool="llama-h100"})` {
		t.Errorf("scaled objects %+v", r.scaled)
	}
}

// checkRedisHardened checks the chart's Redis: a generated password in a Secret that Redis requires and
// infergate is given, a NetworkPolicy that admits only infergate's pods, and an append-only file on a volume.
func checkRedisHardened(t *testing.T, r rendered, infergate corev1.Container) {
	t.Helper()
	var redis *appsv1.Deployment
	for _, d := range r.deployments {
		if d.Name == "infergate-redis" {
			redis = d
		}
	}
	if redis == nil {
		t.Fatal("no Redis Deployment")
	}
	rc := redis.Spec.Template.Spec.Containers[0]
	args := strings.Join(rc.Args, " ")
	for _, want := range []string{"--appendonly yes", "--appendfsync always", "--requirepass $(REDIS_PASSWORD)"} {
		if !strings.Contains(args, want) {
			t.Errorf("Redis args %q lack %s", args, want)
		}
	}
	secret := secretNamed(r, "infergate-redis")
	if secret == nil || len(secret.Data["password"]) < 32 {
		t.Fatalf("no generated Redis password: %+v", secret)
	}
	fromSecret := func(c corev1.Container, env string) bool {
		for _, e := range c.Env {
			if e.Name == env && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil &&
				e.ValueFrom.SecretKeyRef.Name == "infergate-redis" && e.ValueFrom.SecretKeyRef.Key == "password" {
				return true
			}
		}
		return false
	}
	if !fromSecret(rc, "REDIS_PASSWORD") || !fromSecret(infergate, "INFERGATE_REDIS_PASSWORD") {
		t.Errorf("the password does not reach Redis (%v) and infergate (%v)", rc.Env, infergate.Env)
	}
	vols := redis.Spec.Template.Spec.Volumes
	if len(r.claims) != 1 || len(vols) != 1 || vols[0].PersistentVolumeClaim == nil ||
		vols[0].PersistentVolumeClaim.ClaimName != r.claims[0].Name || redis.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("Redis data: claims %+v, volumes %+v, strategy %v", r.claims, vols, redis.Spec.Strategy.Type)
	}
	checkMessageKey(t, r, infergate, "infergate-redis-message-key")
	key := secretNamed(r, "infergate-redis-message-key")
	if key == nil || len(key.Data["key"]) < 32 {
		t.Fatalf("no generated key for the messages replicas share over Redis: %+v", key)
	}
	// An upgrade reads the key back: replicas of two releases must open each other's messages.
	kept := secretNamed(renderIn(t, "testdata/everything.yaml", cluster(t, key)), "infergate-redis-message-key")
	if kept == nil || string(kept.Data["key"]) != string(key.Data["key"]) {
		t.Error("an upgrade drew another Redis message key")
	}
	np := netpolNamed(r, "infergate-redis")
	if np == nil || np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != "infergate-redis" || len(np.Spec.Ingress) != 1 ||
		len(np.Spec.Ingress[0].From) != 1 || np.Spec.Ingress[0].From[0].PodSelector == nil ||
		np.Spec.Ingress[0].From[0].PodSelector.MatchLabels["app.kubernetes.io/name"] != "infergate" {
		t.Errorf("Redis network policy %+v", np)
	}
}

// checkMessageKey checks that infergate reads the key that signs what replicas share over Redis from the
// Secret named secret, mounted read-only.
func checkMessageKey(t *testing.T, r rendered, infergate corev1.Container, secret string) {
	t.Helper()
	if !slices.Contains(infergate.Args, "--redis-message-key-file=/etc/infergate/redis-message-key/key") || !mounted(infergate, "/etc/infergate/redis-message-key") {
		t.Errorf("infergate is not given the Redis message key: args %q, mounts %+v", infergate.Args, infergate.VolumeMounts)
	}
	var from string
	var items []corev1.KeyToPath
	for _, v := range r.infergate(t).Spec.Template.Spec.Volumes {
		if v.Name == "redis-message-key" && v.Secret != nil {
			from, items = v.Secret.SecretName, v.Secret.Items
		}
	}
	if from != secret || len(items) != 1 || items[0].Key != "key" || items[0].Path != "key" {
		t.Errorf("the Redis message key comes from Secret %q (items %+v), want %q's key", from, items, secret)
	}
}

// checkSecretsReadable: Secret volumes' files belong to root, so one whose mode gives only its owner read needs
// the pod's fsGroup to be infergate's group, which kubelet then gives read.
func checkSecretsReadable(t *testing.T, r rendered) {
	t.Helper()
	spec := r.infergate(t).Spec.Template.Spec
	for _, v := range spec.Volumes {
		if v.Secret == nil || v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o044 != 0 {
			continue
		}
		if sc := spec.SecurityContext; sc == nil || sc.FSGroup == nil || sc.RunAsGroup == nil || *sc.FSGroup != *sc.RunAsGroup {
			t.Errorf("Secret volume %s (mode %o) is root's and unreadable to infergate: the pod sets no fsGroup of its group", v.Name, *v.Secret.DefaultMode)
		}
	}
}

// TestExternalRedisKeepsItsOwnSecrets: with an external Redis whose password and message key are the
// operator's Secrets, infergate reads both from there and the chart generates neither.
func TestExternalRedisKeepsItsOwnSecrets(t *testing.T) {
	r := render(t, "testdata/external-redis.yaml")
	c := r.infergate(t).Spec.Template.Spec.Containers[0]
	if !slices.Contains(c.Args, "--redis-addr=redis.data.svc:6379") {
		t.Errorf("args %q lack the Redis address", c.Args)
	}
	checkMessageKey(t, r, c, "quota-redis-signing")
	checkSecretsReadable(t, r)
	for _, name := range []string{"infergate-redis", "infergate-redis-message-key"} {
		if secretNamed(r, name) != nil {
			t.Errorf("the chart generated Secret %s beside the operator's", name)
		}
	}
	if len(r.deployments) != 1 {
		t.Errorf("%d deployments: the chart runs no Redis of its own here", len(r.deployments))
	}
}

func secretNamed(r rendered, name string) *corev1.Secret {
	for _, s := range r.secrets {
		if s.Name == name {
			return s
		}
	}
	return nil
}

func configMapNamed(r rendered, name string) *corev1.ConfigMap {
	for _, c := range r.configMaps {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func netpolNamed(r rendered, name string) *networkingv1.NetworkPolicy {
	for _, n := range r.netpols {
		if n.Name == name {
			return n
		}
	}
	return nil
}

func mounted(c corev1.Container, path string) bool {
	for _, m := range c.VolumeMounts {
		if m.MountPath == path {
			return true
		}
	}
	return false
}

// The chart's rules are deploy/observability's (the chart cannot read outside its folder).
func TestRulesAreTheShippedOnes(t *testing.T) {
	a, err := os.ReadFile("infergate/files/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("../observability/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("deploy/helm/infergate/files/rules.yaml differs from deploy/observability/rules.yaml: copy it")
	}
}

// objects is every rendered object's metadata (the kinds the default values render, and Redis's claim).
func (r rendered) objects() []metav1.Object {
	var out []metav1.Object
	out = appendObjects(out, r.deployments)
	out = appendObjects(out, r.services)
	out = appendObjects(out, r.configMaps)
	out = appendObjects(out, r.secrets)
	out = appendObjects(out, r.serviceAccounts)
	out = appendObjects(out, r.pdbs)
	out = appendObjects(out, r.roles)
	out = appendObjects(out, r.bindings)
	out = appendObjects(out, r.netpols)
	return appendObjects(out, r.claims)
}

func appendObjects[T metav1.Object](out []metav1.Object, objs []T) []metav1.Object {
	for _, o := range objs {
		out = append(out, o)
	}
	return out
}

// With the default values the chart installs into whatever namespace it is given, creating nothing elsewhere
// (helm install -n <ns> needs no other namespace to exist): the default policy's Service and the Role that lets
// infergate watch its EndpointSlices are in the release's namespace too.
func TestInstallsIntoAnyNamespace(t *testing.T) {
	for _, ns := range []string{"infergate", "llm-gateway"} {
		t.Run(ns, func(t *testing.T) {
			r := renderNS(t, "", ns, nil)
			objs := r.objects()
			if len(objs) < 8 {
				t.Fatalf("%d objects rendered", len(objs))
			}
			for _, o := range objs {
				if o.GetNamespace() != ns {
					t.Errorf("%s is in namespace %q, want the release's %q", o.GetName(), o.GetNamespace(), ns)
				}
			}
			pol := configMapNamed(r, "infergate-policy")
			snap, err := policies.Parse("configmap/policy.yaml", []byte(pol.Data["policy.yaml"]))
			if err != nil {
				t.Fatal(err)
			}
			for _, ref := range snap.Services() {
				if ref.Namespace != ns || !hasRole(r, ns, ns) {
					t.Errorf("the policy's Service %s/%s: no Role for it in the release's namespace", ref.Namespace, ref.Name)
				}
			}
			for _, l := range lint.All(chartDir, map[string]any{}, ns, false).Messages {
				if l.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", l)
				}
			}
		})
	}
}

// values.schema.json refuses what the chart would otherwise ignore or render into a broken object: a misspelt
// key, a value of the wrong type or outside its range. Valid values (the defaults and everything.yaml, above)
// pass it.
func TestValuesSchemaRefusesMistakes(t *testing.T) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"a misspelt key", map[string]any{"tls": map[string]any{"enable": false}}, "enable"},
		{"a misplaced key", map[string]any{"secretName": "x"}, "secretName"},
		{"a string for a boolean", map[string]any{"tls": map[string]any{"enabled": "no"}}, "enabled"},
		{"a port out of range", map[string]any{"ports": map[string]any{"xds": 70000}}, "xds"},
		{"a bad duration", map[string]any{"drainTimeout": "30 seconds"}, "drainTimeout"},
		{"an unknown log level", map[string]any{"logLevel": "verbose"}, "logLevel"},
		{"an unknown autoscaler", map[string]any{"autoscaling": map[string]any{"mode": "vpa"}}, "mode"},
		{"an autoscaled pool without its deployment", map[string]any{"autoscaling": map[string]any{"pools": []any{
			map[string]any{"model": "m", "pool": "p"}}}}, "deployment"},
		{"a namespace that is no DNS name", map[string]any{"discovery": map[string]any{"namespaces": []any{"Inference"}}}, "namespaces"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := chartutil.ToRenderValues(chrt, tc.values, chartutil.ReleaseOptions{Name: "infergate", Namespace: "infergate",
				IsInstall: true}, chartutil.DefaultCapabilities.Copy())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("values %v: error %v, want one naming %q", tc.values, err, tc.want)
			}
		})
	}
}

// The chart's README documents every value: each key of values.yaml, nested ones by their last name
// (`tls.enabled`, or `.storageClass` in a row that has just named `redis.persistence.size`).
func TestReadmeDocumentsEveryValue(t *testing.T) {
	readme, err := os.ReadFile("infergate/README.md")
	if err != nil {
		t.Fatal(err)
	}
	var walk func(prefix string, v map[string]any)
	walk = func(prefix string, v map[string]any) {
		for k, sub := range v {
			path := prefix + k
			if m, ok := sub.(map[string]any); ok && len(m) > 0 && k != "keys" && k != "resources" {
				walk(path+".", m)
				continue
			}
			if !bytes.Contains(readme, []byte("`"+path+"`")) && !bytes.Contains(readme, []byte("`."+k+"`")) &&
				!bytes.Contains(readme, []byte("`"+path+".")) {
				t.Errorf("infergate/README.md does not document %s", path)
			}
		}
	}
	walk("", values(t, chartDir+"/values.yaml"))
}
