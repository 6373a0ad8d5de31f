// Command kube-apiserver is upstream's kube-apiserver (k8s.io/kubernetes at the
// version go.mod pins), built for vgpu-state's real-cluster tests. Test
// infrastructure only.
package main

import (
	"os"
	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
