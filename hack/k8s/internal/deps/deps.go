// Package deps pins every upstream package the test infrastructure builds, so
// `go mod tidy` keeps them in go.sum before the programs using them exist.
package deps

import (
	_ "go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	_ "k8s.io/kubernetes/pkg/kubelet/cm/dra"
	_ "k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)
