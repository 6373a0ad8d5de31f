#!/bin/sh
# Builds the real Kubernetes components the test suite runs (kube-apiserver,
# etcd, kube-controller-manager for its garbage collector, and kubelet-harness:
# the kubelet's device and DRA managers) from the Go
# module proxy, into hack/k8s/bin/ (ignored by git; or $VGPU_STATE_K8S_BIN).
# Only what is missing or was built from other sources is built; the Go build
# and module caches make a rebuild fast. Test infrastructure only.
#   hack/k8s/build.sh [program ...]
#   (default: kube-apiserver etcd kubelet-harness kube-controller-manager vap-status)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
GO=${GO:-go}
command -v "$GO" >/dev/null 2>&1 || { echo "hack/k8s/build.sh: Go is not installed (need go >= 1.26)" >&2; exit 127; }
bin=${VGPU_STATE_K8S_BIN:-$here/bin}
mkdir -p "$bin"
[ "$#" -gt 0 ] || set -- kube-apiserver etcd kubelet-harness kube-controller-manager vap-status
for prog in "$@"; do
    out="$bin/$prog"
    ldflags=
    if [ "$prog" = kube-apiserver ] || [ "$prog" = kube-controller-manager ]; then
        # The version it reports (/version, what clients such as helm check), as
        # upstream's release build stamps it: the k8s.io/kubernetes module's.
        version=$("$GO" list -m -f '{{.Version}}' k8s.io/kubernetes)
        minor=$(echo "$version" | cut -d. -f2)
        ldflags="-X k8s.io/component-base/version.gitVersion=$version"
        ldflags="$ldflags -X k8s.io/component-base/version.gitMajor=1"
        ldflags="$ldflags -X k8s.io/component-base/version.gitMinor=$minor"
        ldflags="$ldflags -X k8s.io/component-base/version.gitTreeState=clean"
    fi
    # Up to date when built from the same go.mod, go.sum, sources, link flags and Go
    # version (contents, not times: a checkout or rebase touches files without
    # changing them).
    key=$( { cat go.mod go.sum "cmd/$prog"/*.go; "$GO" env GOVERSION; printf '%s' "$ldflags"; } | cksum)
    if [ -x "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$key" ]; then
        continue
    fi
    echo "hack/k8s/build.sh: building $prog" >&2
    start=$(date +%s)
    # -trimpath and no VCS stamp: the same sources give the same binary anywhere.
    # A temporary file of this build's own: two test runs may build at once.
    "$GO" build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$out.tmp.$$" "./cmd/$prog"
    mv "$out.tmp.$$" "$out"
    echo "$key" > "$out.stamp"
    echo "hack/k8s/build.sh: built $prog in $(( $(date +%s) - start )) s" >&2
done
