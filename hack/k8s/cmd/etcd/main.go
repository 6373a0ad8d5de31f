// Command etcd is upstream's etcd server (go.etcd.io/etcd/server/v3 at the
// version go.mod pins), built for vgpu-state's real-cluster tests. Test
// infrastructure only.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
