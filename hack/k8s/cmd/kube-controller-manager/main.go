// Command kube-controller-manager is upstream's kube-controller-manager
// (k8s.io/kubernetes at the version go.mod pins), built for vgpu-state's
// real-cluster tests, which run only its garbage collector. Test
// infrastructure only.
package main

import (
	"os"
	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
