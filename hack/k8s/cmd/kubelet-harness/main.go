// Command kubelet-harness acts as the kubelet for vgpu-state's tests: it runs the
// kubelet's own device manager (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager)
// or its own DRA manager (pkg/kubelet/cm/dra) with the plugin registration
// watcher (pkg/kubelet/pluginmanager) on directories the test chooses, and
// answers requests read from stdin, one JSON object per line, with one JSON
// object per line on stdout. Logs go to stderr. Test infrastructure only.
//
//	kubelet-harness devicemanager --dir DIR
//	kubelet-harness dra --kubeconfig FILE --node NAME --registry-dir DIR --state-dir DIR
//
// Requests ({"op": ...}) and answers are documented on each handler below.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	_ "unsafe" // go:linkname, see newManagerImpl

	cadvisorapi "github.com/google/cadvisor/info/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

// newManagerImpl is the device manager's own constructor. The exported
// NewManagerImpl passes it the fixed path /var/lib/kubelet/device-plugins/kubelet.sock
// and nothing else; the harness calls it with a socket in the test's directory,
// as the device manager's own tests do.
//
//go:linkname newManagerImpl k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newManagerImpl(logger klog.Logger, socketPath string, topology []cadvisorapi.Node, topologyAffinityStore topologymanager.Store) (*devicemanager.ManagerImpl, error)

type sourcesReady struct{}

func (sourcesReady) AddSource(string) {}
func (sourcesReady) AllReady() bool   { return true }

type request struct {
	Op        string            `json:"op"`
	Pod       string            `json:"pod"`
	Namespace string            `json:"namespace"`
	Container string            `json:"container"`
	Limits    map[string]int64  `json:"limits"`
	Driver    string            `json:"driver"`
	Extra     map[string]string `json:"extra"`
}

type pods struct {
	mu   sync.Mutex
	byID map[types.UID]*v1.Pod
}

func (p *pods) active() []*v1.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*v1.Pod, 0, len(p.byID))
	for _, pod := range p.byID {
		out = append(out, pod)
	}
	return out
}

func (p *pods) set(pod *v1.Pod, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.byID[pod.UID] = pod
	} else {
		delete(p.byID, pod.UID)
	}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kubelet-harness devicemanager|dra [flags]")
		os.Exit(2)
	}
	klogFlags := flag.NewFlagSet("klog", flag.ExitOnError)
	klog.InitFlags(klogFlags)
	_ = klogFlags.Set("v", os.Getenv("KUBELET_HARNESS_V"))
	var err error
	switch os.Args[1] {
	case "devicemanager":
		err = runDeviceManager(os.Args[2:])
	case "dra":
		err = runDRA(os.Args[2:])
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-harness:", err)
		os.Exit(1)
	}
}

// serve reads requests from stdin until EOF and writes each answer as one line.
func serve(handle func(request) any) {
	out := json.NewEncoder(os.Stdout)
	_ = out.Encode(map[string]any{"ready": true})
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		var req request
		var answer any
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			answer = map[string]any{"error": "bad request: " + err.Error()}
		} else {
			answer = handle(req)
		}
		_ = out.Encode(answer)
	}
}

func errAnswer(err error) map[string]any { return map[string]any{"error": err.Error()} }

// ---------------------------------------------------------------------------
// Device plugins

func runDeviceManager(args []string) error {
	fs := flag.NewFlagSet("devicemanager", flag.ExitOnError)
	dir := fs.String("dir", "", "the device-plugins directory (kubelet.sock and the plugins' sockets)")
	_ = fs.Parse(args)
	if *dir == "" {
		return fmt.Errorf("--dir is required")
	}
	logger := klog.Background()
	// The topology manager the kubelet builds with its default policy "none".
	topo, err := topologymanager.NewManager(nil, topologymanager.PolicyNone, topologymanager.ContainerTopologyScope, nil)
	if err != nil {
		return fmt.Errorf("topology manager: %w", err)
	}
	m, err := newManagerImpl(logger, strings.TrimRight(*dir, "/")+"/kubelet.sock", nil, topo)
	if err != nil {
		return err
	}
	active := &pods{byID: map[types.UID]*v1.Pod{}}
	if err := m.Start(logger, active.active, sourcesReady{}, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		return err
	}
	defer func() { _ = m.Stop(logger) }()
	serve(func(req request) any {
		switch req.Op {
		case "capacity":
			return capacity(m)
		case "allocate":
			return allocate(m, active, req)
		default:
			return map[string]any{"error": "unknown op " + req.Op}
		}
	})
	return nil
}

// capacity answers {"capacity": {res: n}, "allocatable": {res: n}, "healthy": {res: [ids]},
// "deleted": [res]}: what the kubelet would write into the Node's status.
func capacity(m *devicemanager.ManagerImpl) any {
	capList, allocList, deleted := m.GetCapacity()
	toMap := func(l v1.ResourceList) map[string]int64 {
		out := map[string]int64{}
		for k, v := range l {
			out[string(k)] = v.Value()
		}
		return out
	}
	healthy := map[string][]string{}
	for res, devs := range m.GetAllocatableDevices() {
		ids := make([]string, 0, len(devs))
		for id := range devs {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		healthy[res] = ids
	}
	sort.Strings(deleted)
	return map[string]any{
		"capacity":    toMap(capList),
		"allocatable": toMap(allocList),
		"healthy":     healthy,
		"deleted":     deleted,
	}
}

// allocate admits a pod with one container whose limits are req.Limits, as the
// kubelet does before starting it (Allocate), and answers with the container's
// run options (GetDeviceRunContainerOptions): {"envs": {..}, "devices":
// [{host, container, permissions}], "mounts": [...], "annotations": {..},
// "cdi": [..], "device_ids": {res: [ids]}}.
func allocate(m *devicemanager.ManagerImpl, active *pods, req request) any {
	name := req.Pod
	if name == "" {
		name = "vm"
	}
	limits := v1.ResourceList{}
	for res, n := range req.Limits {
		limits[v1.ResourceName(res)] = *resource.NewQuantity(n, resource.DecimalSI)
	}
	container := v1.Container{Name: "compute", Resources: v1.ResourceRequirements{Limits: limits, Requests: limits}}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec:       v1.PodSpec{Containers: []v1.Container{container}},
	}
	active.set(pod, true)
	if err := m.Allocate(pod, &pod.Spec.Containers[0]); err != nil {
		active.set(pod, false)
		return errAnswer(err)
	}
	opts, err := m.GetDeviceRunContainerOptions(context.Background(), pod, &pod.Spec.Containers[0])
	if err != nil {
		return errAnswer(err)
	}
	envs := map[string]string{}
	for _, e := range opts.Envs {
		envs[e.Name] = e.Value
	}
	devices := []map[string]string{}
	for _, d := range opts.Devices {
		devices = append(devices, map[string]string{"host": d.PathOnHost, "container": d.PathInContainer, "permissions": d.Permissions})
	}
	mounts := []map[string]string{}
	for _, mt := range opts.Mounts {
		mounts = append(mounts, map[string]string{"host": mt.HostPath, "container": mt.ContainerPath})
	}
	annotations := map[string]string{}
	for _, a := range opts.Annotations {
		annotations[a.Name] = a.Value
	}
	cdi := []string{}
	for _, c := range opts.CDIDevices {
		cdi = append(cdi, c.Name)
	}
	ids := map[string][]string{}
	for res, devs := range m.GetDevices(string(pod.UID), container.Name) {
		for id := range devs {
			ids[res] = append(ids[res], id)
		}
		sort.Strings(ids[res])
	}
	return map[string]any{"envs": envs, "devices": devices, "mounts": mounts, "annotations": annotations, "cdi": cdi, "device_ids": ids}
}

// ---------------------------------------------------------------------------
// Dynamic Resource Allocation

func runDRA(args []string) error {
	fs := flag.NewFlagSet("dra", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the API server the claims are read from")
	nodeName := fs.String("node", "", "the node this kubelet runs")
	registryDir := fs.String("registry-dir", "", "the plugins_registry directory the watcher watches")
	stateDir := fs.String("state-dir", "", "where the DRA manager keeps its checkpoint")
	_ = fs.Parse(args)
	if *kubeconfig == "" || *nodeName == "" || *registryDir == "" || *stateDir == "" {
		return fmt.Errorf("--kubeconfig, --node, --registry-dir and --state-dir are required")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	logger := klog.Background()
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	defer cancel()

	m, err := dra.NewManager(logger, client, *stateDir)
	if err != nil {
		return err
	}
	active := &pods{byID: map[types.UID]*v1.Pod{}}
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, *nodeName, metav1.GetOptions{})
	}
	if err := m.Start(ctx, active.active, getNode, sourcesReady{}); err != nil {
		return err
	}
	// The kubelet's plugin watcher on the registry directory, with the DRA
	// manager's registration handler, as the kubelet wires them.
	pm := pluginmanager.NewPluginManager(*registryDir, &record.FakeRecorder{})
	pm.AddHandler(registerapi.DRAPlugin, m.GetWatcherHandler())
	stop := make(chan struct{})
	go pm.Run(ctx, sourcesReady{}, stop)
	defer close(stop)
	plugins := m.GetWatcherHandler().(*draplugin.DRAPluginManager)

	serve(func(req request) any {
		switch req.Op {
		case "registered":
			// {"registered": bool, "error": why not}
			if _, err := plugins.GetPlugin(req.Driver); err != nil {
				return map[string]any{"registered": false, "why": err.Error()}
			}
			return map[string]any{"registered": true}
		case "prepare":
			// The pod is read from the API server; answers {"containers": {name: [CDI ids]}}.
			pod, err := client.CoreV1().Pods(req.Namespace).Get(ctx, req.Pod, metav1.GetOptions{})
			if err != nil {
				return errAnswer(err)
			}
			active.set(pod, true)
			if err := m.PrepareResources(ctx, pod); err != nil {
				return errAnswer(err)
			}
			containers := map[string][]string{}
			for i := range pod.Spec.Containers {
				c := &pod.Spec.Containers[i]
				info, err := m.GetResources(pod, c)
				if err != nil {
					return errAnswer(err)
				}
				ids := []string{}
				for _, d := range info.CDIDevices {
					ids = append(ids, d.Name)
				}
				containers[c.Name] = ids
			}
			return map[string]any{"containers": containers}
		case "unprepare":
			pod, err := client.CoreV1().Pods(req.Namespace).Get(ctx, req.Pod, metav1.GetOptions{})
			if err != nil {
				return errAnswer(err)
			}
			if err := m.UnprepareResources(ctx, pod); err != nil {
				return errAnswer(err)
			}
			active.set(pod, false)
			return map[string]any{"ok": true}
		default:
			return map[string]any{"error": "unknown op " + req.Op}
		}
	})
	return nil
}
