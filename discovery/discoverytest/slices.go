// Package discoverytest is an in-memory EndpointSlice API for the tests of discovery and of the stacks built on
// it: client-go's object tracker behind the typed discovery/v1 client, as its generated fake clientset does for
// every API group, without compiling the other groups' ~230 packages into the tests that use it.
package discoverytest

import (
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	fakediscoveryv1 "k8s.io/client-go/kubernetes/typed/discovery/v1/fake"
	clienttesting "k8s.io/client-go/testing"
)

// Slices serves EndpointSlices from memory: List, Watch, Create, Update and Delete as the API server answers
// them. It implements discovery's EndpointSlicesGetter.
type Slices struct {
	*fakediscoveryv1.FakeDiscoveryV1
}

// IsWatchListSemanticsUnSupported tells client-go's reflector to list and then watch, as it does for its own
// fake clients: the tracker does not stream a watch's initial list.
func (Slices) IsWatchListSemanticsUnSupported() bool { return true }

// New is an API holding the slices given.
func New(slices ...*discoveryv1.EndpointSlice) (Slices, error) {
	scheme := runtime.NewScheme()
	if err := discoveryv1.AddToScheme(scheme); err != nil {
		return Slices{}, err
	}
	tracker := clienttesting.NewObjectTracker(scheme, serializer.NewCodecFactory(scheme).UniversalDecoder())
	for _, s := range slices {
		if err := tracker.Add(s); err != nil {
			return Slices{}, err
		}
	}
	fake := &clienttesting.Fake{}
	fake.AddReactor("*", "*", clienttesting.ObjectReaction(tracker))
	fake.AddWatchReactor("*", func(action clienttesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if w, ok := action.(clienttesting.WatchActionImpl); ok {
			opts = w.ListOptions
		}
		w, err := tracker.Watch(action.GetResource(), action.GetNamespace(), opts)
		return err == nil, w, err
	})
	return Slices{&fakediscoveryv1.FakeDiscoveryV1{Fake: fake}}, nil
}
