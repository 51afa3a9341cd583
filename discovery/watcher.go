// Package discovery finds the replicas of pools that name a Kubernetes Service: it watches the Service's
// EndpointSlices with client-go informers and hands the policy store the ready, not terminating endpoints,
// so the picker, the engine scraper and the xDS EDS follow pods as they come and go. It needs only the
// discovery/v1 client, not client-go's clientset of every API group (~230 packages more in the binary).
package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	discoveryclient "k8s.io/client-go/kubernetes/typed/discovery/v1"
	listersv1 "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/infergate/infergate/policies"
)

// syncTimeout bounds the wait for a namespace's first list of EndpointSlices.
const syncTimeout = 30 * time.Second

// Watcher implements policies.EndpointResolver from EndpointSlices. One informer per namespace the policy's
// Services live in: a namespaced Role (get, list, watch endpointslices) is all it needs.
type Watcher struct {
	client discoveryclient.EndpointSlicesGetter
	store  *policies.Store
	log    *slog.Logger

	mu         sync.Mutex
	ctx        context.Context
	namespaces map[string]listersv1.EndpointSliceLister
	endpoints  map[policies.ServiceRef][]string
}

// New builds a Watcher on the discovery/v1 API (discoveryclient.NewForConfig, or a test's in-memory one);
// Start begins watching.
func New(client discoveryclient.EndpointSlicesGetter, store *policies.Store, log *slog.Logger) *Watcher {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Watcher{client: client, store: store, log: log, namespaces: map[string]listersv1.EndpointSliceLister{},
		endpoints: map[policies.ServiceRef][]string{}}
}

// Start watches the namespaces of the current policy's Services, waits for their first lists, and makes the
// store resolve pools from them; a reload that names a new namespace starts its informer. The informers stop
// with ctx.
func (w *Watcher) Start(ctx context.Context) error {
	w.mu.Lock()
	w.ctx = ctx
	w.mu.Unlock()
	for _, ns := range namespacesOf(w.store.Current()) {
		if err := w.watch(ns, true); err != nil {
			return err
		}
	}
	w.recompute()
	w.store.SetResolver(w)
	w.store.OnChange(func(snap *policies.Snapshot) {
		for _, ns := range namespacesOf(snap) {
			if err := w.watch(ns, false); err != nil {
				w.log.Error("cannot watch the namespace of a pool's Service", "namespace", ns, "err", err)
			}
		}
	})
	return nil
}

func namespacesOf(snap *policies.Snapshot) []string {
	var out []string
	for _, ref := range snap.Services() {
		if !slices.Contains(out, ref.Namespace) {
			out = append(out, ref.Namespace)
		}
	}
	return out
}

// watch starts a namespace's informer once; wait blocks until its first list is in.
func (w *Watcher) watch(ns string, wait bool) error {
	w.mu.Lock()
	if _, ok := w.namespaces[ns]; ok {
		w.mu.Unlock()
		return nil
	}
	inf := cache.NewSharedIndexInformer(listWatch(w.client, ns), &discoveryv1.EndpointSlice{}, 0,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	w.namespaces[ns] = listersv1.NewEndpointSliceLister(inf.GetIndexer())
	ctx := w.ctx
	w.mu.Unlock()
	changed := func(any) { w.changed() }
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: changed, UpdateFunc: func(_, o any) { changed(o) }, DeleteFunc: changed,
	}); err != nil {
		return err
	}
	go inf.RunWithContext(ctx)
	if !wait {
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), inf.HasSynced) {
		return fmt.Errorf("EndpointSlices of namespace %s: not listed within %v (RBAC: get, list, watch endpointslices)", ns, syncTimeout)
	}
	return nil
}

// listWatch lists and watches a namespace's EndpointSlices, as client-go's generated informer does.
func listWatch(client discoveryclient.EndpointSlicesGetter, ns string) cache.ListerWatcher {
	api := client.EndpointSlices(ns)
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return api.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return api.Watch(ctx, opts)
		},
	}, client)
}

// changed recomputes every Service's endpoints and refreshes the store when one moved.
func (w *Watcher) changed() {
	if w.recompute() {
		w.store.Refresh()
	}
}

// recompute lists every Service's slices; it reports whether any endpoint list changed.
func (w *Watcher) recompute() bool {
	refs := w.store.Current().Services()
	w.mu.Lock()
	defer w.mu.Unlock()
	next := map[policies.ServiceRef][]string{}
	for _, ref := range refs {
		lister, ok := w.namespaces[ref.Namespace]
		if !ok {
			continue
		}
		found, err := lister.EndpointSlices(ref.Namespace).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: ref.Name}))
		if err != nil {
			w.log.Warn("listing EndpointSlices failed", "namespace", ref.Namespace, "service", ref.Name, "err", err)
			continue
		}
		next[ref] = Ready(found, ref.Port)
	}
	if maps.EqualFunc(next, w.endpoints, slices.Equal[[]string]) {
		return false
	}
	for ref, eps := range next {
		if !slices.Equal(eps, w.endpoints[ref]) {
			w.log.Info("pool endpoints discovered", "namespace", ref.Namespace, "service", ref.Name, "endpoints", len(eps))
		}
	}
	w.endpoints = next
	return true
}

// Endpoints implements policies.EndpointResolver.
func (w *Watcher) Endpoints(ref policies.ServiceRef) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.endpoints[ref])
}

// Ready lists the ip:port of every endpoint of the slices that is ready and not terminating, on the port named
// (or numbered) port, sorted. A terminating endpoint finishes its requests but takes no new one; a slice
// without that port, or of FQDN addresses, contributes nothing.
func Ready(list []*discoveryv1.EndpointSlice, port string) []string {
	var out []string
	for _, s := range list {
		if s.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		p, ok := portOf(s, port)
		if !ok {
			continue
		}
		for _, e := range s.Endpoints {
			c := e.Conditions
			if (c.Ready != nil && !*c.Ready) || (c.Terminating != nil && *c.Terminating) {
				continue
			}
			for _, a := range e.Addresses {
				out = append(out, net.JoinHostPort(a, strconv.Itoa(int(p))))
			}
		}
	}
	sortUnique(&out)
	return out
}

func portOf(s *discoveryv1.EndpointSlice, want string) (int32, bool) {
	n, numeric := strconv.Atoi(want)
	for _, p := range s.Ports {
		if p.Port == nil {
			continue
		}
		if (p.Name != nil && *p.Name == want) || (numeric == nil && int(*p.Port) == n) {
			return *p.Port, true
		}
	}
	return 0, false
}

func sortUnique(s *[]string) {
	slices.Sort(*s)
	*s = slices.Compact(*s)
}
