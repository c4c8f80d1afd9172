package deploy_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/diff"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/initializer"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating/patch"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/cel/environment"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/discovery"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/openapi"
	"k8s.io/client-go/openapi/openapitest"
	"k8s.io/component-base/compatibility"
)

// admitter is the API server's MutatingAdmissionPolicy admission plugin (k8s.io/apiserver at the cluster's
// version), fed the shipped policy and binding through informers as a cluster feeds it.
type admitter struct {
	plugin *mutating.Plugin
	scheme *runtime.Scheme
}

// clusterWithSchemas is a fake clientset whose discovery serves OpenAPI v3 schemas, which the plugin's
// dispatcher needs for the kinds it patches.
type clusterWithSchemas struct{ *fake.Clientset }

func (c clusterWithSchemas) Discovery() discovery.DiscoveryInterfaces {
	return schemaDiscovery{c.Clientset.Discovery()}
}

type schemaDiscovery struct{ discovery.DiscoveryInterfaces }

func (schemaDiscovery) OpenAPIV3() openapi.Client { return openapitest.NewEmbeddedFileClient() }

type allowAll struct{}

func (allowAll) Authorize(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
	return authorizer.DecisionAllow, "", nil
}

// newAdmitter starts the plugin on a cluster holding objs (the policy objects of a rendering) and the namespaces
// the test pods live in, and waits until the plugin has seen them all.
func newAdmitter(t *testing.T, objs []object) *admitter {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, admissionregistrationv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	var typed []runtime.Object
	for _, ns := range []string{"modelpack", "ml", "default"} {
		typed = append(typed, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
			Labels: map[string]string{"kubernetes.io/metadata.name": ns}}})
	}
	policies := 0
	for _, o := range objs {
		switch v := o.obj.(type) {
		case *admissionregistrationv1.MutatingAdmissionPolicy, *admissionregistrationv1.MutatingAdmissionPolicyBinding:
			typed = append(typed, v.(runtime.Object))
			policies++
		}
	}
	if policies != 2 {
		t.Fatalf("the rendering has %d admission policy objects, want a policy and its binding", policies)
	}
	client := fake.NewClientset(typed...)
	dynamic := dynamicfake.NewSimpleDynamicClient(scheme)
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(corev1.SchemeGroupVersion.WithKind("Pod"), meta.RESTScopeNamespace)
	mapper.Add(corev1.SchemeGroupVersion.WithKind("Namespace"), meta.RESTScopeRoot)

	plugin, err := mutating.NewPlugin(nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	factory := informers.NewSharedInformerFactory(client, 0)
	initializer.New(kubernetes.Interface(clusterWithSchemas{client}), dynamic, factory, allowAll{},
		utilfeature.DefaultFeatureGate, compatibility.NewEffectiveVersionFromString("1.36.3", "", ""), ctx.Done(), mapper).Initialize(plugin)
	if err := plugin.ValidateInitialization(); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return plugin.WaitForReady(), nil
	}); err != nil {
		t.Fatal("the admission plugin never synced its policies")
	}
	return &admitter{plugin: plugin, scheme: scheme}
}

// admit runs a pod CREATE through the plugin as the API server's admission chain does and returns the pod the
// API server would store. reinvoke, if given, plays a later admission step that changes the pod; the chain then
// reinvokes the policy, as it does for reinvocationPolicy IfNeeded.
func (a *admitter) admit(t *testing.T, pod *corev1.Pod, reinvoke func(*corev1.Pod)) (*corev1.Pod, error) {
	t.Helper()
	out := pod.DeepCopy()
	attrs := admission.NewAttributesRecord(out, nil, corev1.SchemeGroupVersion.WithKind("Pod"), out.Namespace, out.Name,
		corev1.SchemeGroupVersion.WithResource("pods"), "", admission.Create, &metav1.CreateOptions{}, false, nil)
	ifaces := admission.NewObjectInterfacesFromScheme(a.scheme)
	if err := a.plugin.Admit(context.Background(), attrs, ifaces); err != nil {
		return nil, err
	}
	if reinvoke != nil {
		reinvoke(out)
		attrs.GetReinvocationContext().SetIsReinvoke()
		if err := a.plugin.Admit(context.Background(), attrs, ifaces); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func imageVolume(name, ref string, policy corev1.PullPolicy) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: ref, PullPolicy: policy}}}
}

func driverVolume(name, ref string, policy corev1.PullPolicy, secret string) corev1.Volume {
	csi := &corev1.CSIVolumeSource{Driver: "modelpack.csi.dev", ReadOnly: new(true),
		VolumeAttributes: map[string]string{"reference": ref, "pullPolicy": string(policy)}}
	if secret != "" {
		csi.NodePublishSecretRef = &corev1.LocalObjectReference{Name: secret}
	}
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{CSI: csi}}
}

// modelPod is an inference pod mounting every volume in an init container and a container, with the fields a
// careless rewrite could drop.
func modelPod(namespace string, labels map[string]string, volumes ...corev1.Volume) *corev1.Pod {
	var mounts []corev1.VolumeMount
	for _, v := range volumes {
		mounts = append(mounts, corev1.VolumeMount{Name: v.Name, MountPath: "/models/" + v.Name, ReadOnly: true})
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "infer", Namespace: namespace, Labels: labels,
			Annotations: map[string]string{"team": "ml"}},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "check", Image: "busybox:1.37", Command: []string{"ls", "/models"}, VolumeMounts: mounts}},
			Containers: []corev1.Container{{Name: "server", Image: "vllm/vllm-openai:v0.9.0", Args: []string{"--model", "/models"},
				VolumeMounts: mounts, Env: []corev1.EnvVar{{Name: "HF_HUB_OFFLINE", Value: "1"}}}},
			Volumes:          volumes,
			NodeSelector:     map[string]string{"gpu": "a100"},
			ImagePullSecrets: nil,
		},
	}
}

const prefixes = `["registry.example.com/models", "docker.io/acme/models/", "localhost:5000"]`

// withPrefixes sets the policy's list of selected reference prefixes, as an overlay or the chart does.
func withPrefixes(t *testing.T, objs []object, list string) []object {
	t.Helper()
	var out []object
	for _, o := range objs {
		if p, ok := o.obj.(*admissionregistrationv1.MutatingAdmissionPolicy); ok {
			p = p.DeepCopy()
			if p.Spec.Variables[0].Name != "prefixes" {
				t.Fatalf("the policy's first variable is %s, not prefixes", p.Spec.Variables[0].Name)
			}
			p.Spec.Variables[0].Expression = list
			o.obj = p
		}
		out = append(out, o)
	}
	return out
}

func TestAdmissionPolicyRewritesSelectedImageVolumes(t *testing.T) {
	a := newAdmitter(t, withPrefixes(t, kustomize(t, "native-volumes"), prefixes))

	emptyDir := corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	existingCSI := driverVolume("pinned", "registry.example.com/models/qwen@sha256:"+strings.Repeat("b", 64), corev1.PullNever, "")
	digest := "@sha256:" + strings.Repeat("a", 64)
	for _, tc := range []struct {
		name   string
		pod    *corev1.Pod
		secret string
		want   []corev1.Volume // nil: the pod is left exactly as it was
	}{
		{name: "the issue's pod", pod: modelPod("ml", nil, imageVolume("model-weights", "registry.example.com/models/llama3-8b:v1", corev1.PullIfNotPresent)),
			want: []corev1.Volume{driverVolume("model-weights", "registry.example.com/models/llama3-8b:v1", corev1.PullIfNotPresent, "")}},
		{name: "a tag, no pullPolicy", pod: modelPod("ml", nil, imageVolume("m", "registry.example.com/models/llama3:v1", "")),
			want: []corev1.Volume{driverVolume("m", "registry.example.com/models/llama3:v1", corev1.PullIfNotPresent, "")}},
		{name: "no tag, no pullPolicy", pod: modelPod("ml", nil, imageVolume("m", "registry.example.com/models/llama3", "")),
			want: []corev1.Volume{driverVolume("m", "registry.example.com/models/llama3", corev1.PullAlways, "")}},
		{name: ":latest, no pullPolicy", pod: modelPod("ml", nil, imageVolume("m", "registry.example.com/models/llama3:latest", "")),
			want: []corev1.Volume{driverVolume("m", "registry.example.com/models/llama3:latest", corev1.PullAlways, "")}},
		{name: "a digest, no pullPolicy", pod: modelPod("ml", nil, imageVolume("m", "registry.example.com/models/llama3"+digest, "")),
			want: []corev1.Volume{driverVolume("m", "registry.example.com/models/llama3"+digest, corev1.PullIfNotPresent, "")}},
		{name: ":latest and a digest, no pullPolicy", pod: modelPod("ml", nil, imageVolume("m", "registry.example.com/models/llama3:latest"+digest, "")),
			want: []corev1.Volume{driverVolume("m", "registry.example.com/models/llama3:latest"+digest, corev1.PullIfNotPresent, "")}},
		{name: "an explicit pullPolicy wins", pod: modelPod("ml", nil, imageVolume("m", "registry.example.com/models/llama3:latest", corev1.PullNever)),
			want: []corev1.Volume{driverVolume("m", "registry.example.com/models/llama3:latest", corev1.PullNever, "")}},
		{name: "a registry with a port, no tag", pod: modelPod("ml", nil, imageVolume("m", "localhost:5000/tiny", "")),
			want: []corev1.Volume{driverVolume("m", "localhost:5000/tiny", corev1.PullAlways, "")}},
		{name: "a Docker Hub name without its host", pod: modelPod("ml", nil, imageVolume("m", "acme/models/phi:3", "")),
			want: []corev1.Volume{driverVolume("m", "acme/models/phi:3", corev1.PullIfNotPresent, "")}},
		{name: "the prefix is the repository itself", pod: modelPod("ml", nil, imageVolume("m", "registry.example.com/models:v2", "")),
			want: []corev1.Volume{driverVolume("m", "registry.example.com/models:v2", corev1.PullIfNotPresent, "")}},
		{name: "a prefix matches whole path components only", pod: modelPod("ml", nil, imageVolume("m", "registry.example.com/models-old/llama3:v1", ""))},
		{name: "a host prefix is not a longer host", pod: modelPod("ml", nil, imageVolume("m", "localhost:50001/tiny:v1", ""))},
		{name: "a container image elsewhere", pod: modelPod("ml", nil, imageVolume("tools", "docker.io/library/busybox:1.37", corev1.PullIfNotPresent))},
		{name: "a Docker Hub short name is under library/", pod: modelPod("ml", nil, imageVolume("m", "models:v1", ""))},
		{name: "a reference with spaces is left to Kubernetes' validation", pod: modelPod("ml", nil, imageVolume("m", " registry.example.com/models/llama3:v1", ""))},
		{name: "several volumes, some selected", pod: modelPod("default", nil,
			emptyDir,
			imageVolume("weights", "registry.example.com/models/llama3:v1", corev1.PullIfNotPresent),
			imageVolume("tools", "docker.io/library/busybox:1.37", corev1.PullIfNotPresent),
			existingCSI,
			imageVolume("adapter", "registry.example.com/models/lora"+digest, corev1.PullIfNotPresent)),
			want: []corev1.Volume{emptyDir,
				driverVolume("weights", "registry.example.com/models/llama3:v1", corev1.PullIfNotPresent, ""),
				imageVolume("tools", "docker.io/library/busybox:1.37", corev1.PullIfNotPresent),
				existingCSI,
				driverVolume("adapter", "registry.example.com/models/lora"+digest, corev1.PullIfNotPresent, "")}},
		{name: "only existing csi volumes", pod: modelPod("ml", nil, existingCSI, emptyDir)},
		{name: "the first pull secret goes to the driver", secret: "models-pull",
			pod:  modelPod("ml", nil, imageVolume("m", "registry.example.com/models/llama3:v1", corev1.PullIfNotPresent)),
			want: []corev1.Volume{driverVolume("m", "registry.example.com/models/llama3:v1", corev1.PullIfNotPresent, "models-pull")}},
		{name: "label true: every image volume of the pod", pod: modelPod("ml", map[string]string{"modelpack.csi.dev/image-volumes": "true"},
			imageVolume("m", "other.example.com/llama3:v1", corev1.PullIfNotPresent), emptyDir),
			want: []corev1.Volume{driverVolume("m", "other.example.com/llama3:v1", corev1.PullIfNotPresent, ""), emptyDir}},
		{name: "label false: none", pod: modelPod("ml", map[string]string{"modelpack.csi.dev/image-volumes": "false"},
			imageVolume("m", "registry.example.com/models/llama3:v1", corev1.PullIfNotPresent))},
		{name: "the driver's own namespace", pod: modelPod("modelpack", map[string]string{"modelpack.csi.dev/image-volumes": "true"},
			imageVolume("m", "registry.example.com/models/llama3:v1", corev1.PullIfNotPresent))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := tc.pod.DeepCopy()
			if tc.secret != "" {
				pod.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: tc.secret}, {Name: "containers-pull"}}
			}
			got, err := a.admit(t, pod, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := pod.DeepCopy()
			if tc.want != nil {
				want.Spec.Volumes = tc.want
			}
			if !equality.Semantic.DeepEqual(got, want) {
				t.Fatalf("admitted pod differs from the expected one (-want +got):\n%s", diff.Diff(want, got))
			}
			// Idempotent: the stored pod, created again, is left as it is.
			again, err := a.admit(t, got, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !equality.Semantic.DeepEqual(again, got) {
				t.Fatalf("a second admission changed the pod:\n%s", diff.Diff(got, again))
			}
		})
	}
}

// TestAdmissionPolicyReinvoked: when a later admission step adds an image volume, the chain reinvokes the policy,
// which rewrites the new volume and leaves the one it already rewrote as it is.
func TestAdmissionPolicyReinvoked(t *testing.T) {
	a := newAdmitter(t, withPrefixes(t, kustomize(t, "native-volumes"), prefixes))
	pod := modelPod("ml", nil, imageVolume("weights", "registry.example.com/models/llama3:v1", corev1.PullIfNotPresent))
	got, err := a.admit(t, pod, func(p *corev1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, imageVolume("injected", "registry.example.com/models/guard:v2", corev1.PullIfNotPresent))
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []corev1.Volume{
		driverVolume("weights", "registry.example.com/models/llama3:v1", corev1.PullIfNotPresent, ""),
		driverVolume("injected", "registry.example.com/models/guard:v2", corev1.PullIfNotPresent, ""),
	}
	if !equality.Semantic.DeepEqual(got.Spec.Volumes, want) {
		t.Fatalf("volumes after reinvocation (-want +got):\n%s", diff.Diff(want, got.Spec.Volumes))
	}
}

// TestAdmissionPolicyDefaultSelectsNothing: as shipped (no prefixes), only a pod that opts in is rewritten.
func TestAdmissionPolicyDefaultSelectsNothing(t *testing.T) {
	a := newAdmitter(t, withPrefixes(t, kustomize(t, "native-volumes"), "[]"))
	pod := modelPod("ml", nil, imageVolume("m", "registry.example.com/models/llama3:v1", corev1.PullIfNotPresent))
	got, err := a.admit(t, pod, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(got, pod) {
		t.Fatalf("a pod was rewritten with no prefixes configured:\n%s", diff.Diff(pod, got))
	}
}

// checkNativeVolumes admits an opted-in pod through a rendering's policy: it must name the rendering's CSI driver,
// and leave the install's own namespace alone.
func checkNativeVolumes(t *testing.T, objs []object, driver string) {
	t.Helper()
	a := newAdmitter(t, objs)
	labels := map[string]string{"modelpack.csi.dev/image-volumes": "true"}
	vol := imageVolume("m", "registry.example.com/models/llama3:v1", corev1.PullIfNotPresent)
	got, err := a.admit(t, modelPod("ml", labels, vol), nil)
	if err != nil {
		t.Fatal(err)
	}
	if csi := got.Spec.Volumes[0].CSI; csi == nil || csi.Driver != driver {
		t.Errorf("the admission policy rewrote %+v, want a csi volume of driver %s", got.Spec.Volumes[0], driver)
	}
	own := modelPod("modelpack", labels, vol)
	if got, err := a.admit(t, own, nil); err != nil || !equality.Semantic.DeepEqual(got, own) {
		t.Errorf("the admission policy changed a pod in the driver's namespace (%v):\n%s", err, diff.Diff(own, got))
	}
}

// specOf is an object's spec, for comparing two renderings of it apart from their labels.
func specOf(obj any) any {
	switch v := obj.(type) {
	case *admissionregistrationv1.MutatingAdmissionPolicy:
		return v.Spec
	case *admissionregistrationv1.MutatingAdmissionPolicyBinding:
		return v.Spec
	}
	return obj
}

// TestAdmissionPolicyCompilesForCreate compiles the policy as the API server does when the policy is created:
// as new expressions, with only the CEL libraries of the server's minimum compatibility version (1.35 for 1.36),
// which is stricter than the plugin's compilation of stored policies the other tests go through.
func TestAdmissionPolicyCompilesForCreate(t *testing.T) {
	for name, objs := range map[string][]object{
		"kustomize": kustomize(t, "native-volumes"),
		"rendered":  decode(t, "rendered", readFile(t, "rendered/native-volumes.yaml")),
	} {
		t.Run(name, func(t *testing.T) {
			policy := only[*admissionregistrationv1.MutatingAdmissionPolicy](t, objs)
			compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(utilversion.MajorMinor(1, 35)))
			if err != nil {
				t.Fatal(err)
			}
			opts := plugincel.OptionalVariableDeclarations{HasAuthorizer: true, HasPatchTypes: true}
			for _, v := range policy.Spec.Variables {
				res := compiler.CompileAndStoreVariable(&validating.Variable{Name: v.Name, Expression: v.Expression}, opts, environment.NewExpressions)
				if res.Error != nil {
					t.Errorf("variable %s: %v", v.Name, res.Error)
				}
			}
			for _, m := range policy.Spec.MatchConditions {
				if res := compiler.CompileCELExpression((*matchconditions.MatchCondition)(&m), opts, environment.NewExpressions); res.Error != nil {
					t.Errorf("matchCondition %s: %v", m.Name, res.Error)
				}
			}
			for i, m := range policy.Spec.Mutations {
				if m.JSONPatch == nil {
					t.Fatalf("mutation %d is not a JSONPatch", i)
				}
				e := compiler.CompileMutatingEvaluator(&patch.JSONPatchCondition{Expression: m.JSONPatch.Expression}, opts, environment.NewExpressions)
				if errs := e.CompilationErrors(); len(errs) > 0 {
					t.Errorf("mutation %d: %v", i, errs)
				}
			}
		})
	}
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
