#!/bin/sh
# Builds the real Kubernetes components the test suite runs (kube-apiserver,
# etcd, kube-controller-manager for its garbage collector, vap-status, and
# kubelet-harness: the kubelet's device and DRA managers) from the Go
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
# The version the components report (/version, what clients such as helm check),
# as upstream's release build stamps it: the k8s.io/kubernetes module's. -s -w: no
# symbol table and no DWARF (stack traces keep their names and lines), which makes
# each link faster and each binary smaller.
version=$("$GO" list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=$(echo "$version" | cut -d. -f2)
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version"
ldflags="$ldflags -X k8s.io/component-base/version.gitMajor=1"
ldflags="$ldflags -X k8s.io/component-base/version.gitMinor=$minor"
ldflags="$ldflags -X k8s.io/component-base/version.gitTreeState=clean"
# Up to date when built from the same go.mod, go.sum, sources, link flags and Go
# version (contents, not times: a checkout or rebase touches files without
# changing them).
key_of() {
    { cat go.mod go.sum "cmd/$1"/*.go; "$GO" env GOVERSION; printf '%s' "$ldflags"; } | cksum
}
stale=
cached=
for prog in "$@"; do
    [ -d "cmd/$prog" ] || { echo "hack/k8s/build.sh: no program $prog (cmd/$prog)" >&2; exit 2; }
    if [ -x "$bin/$prog" ] && [ "$(cat "$bin/$prog.stamp" 2>/dev/null)" = "$(key_of "$prog")" ]; then
        cached="$cached $prog"
    else
        stale="$stale $prog"
    fi
done
[ -z "$cached" ] || echo "$(echo $cached | sed 's/ /, /g'): cached" >&2
[ -n "$stale" ] || exit 0
names=$(echo $stale | sed 's/ /, /g')
echo "hack/k8s/build.sh: building $names" >&2
start=$(date +%s)
# One go build for all of them: the package graph is loaded once, the packages
# only one of them needs are compiled beside the shared ones (both cores busy to
# the end) and the links run side by side. A directory of this build's own:
# two test runs may build at once. -trimpath and no VCS stamp: the same sources
# give the same binary anywhere. Quiet when it works (the module downloads); all
# of it when it fails.
tmp=$(mktemp -d "$bin/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
pkgs=
for prog in $stale; do pkgs="$pkgs ./cmd/$prog"; done
# shellcheck disable=SC2086
if ! "$GO" build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$tmp/" $pkgs >"$tmp/log" 2>&1; then
    cat "$tmp/log" >&2
    echo "hack/k8s/build.sh: building $names failed" >&2
    exit 1
fi
for prog in $stale; do
    mv "$tmp/$prog" "$bin/$prog"
    key_of "$prog" > "$bin/$prog.stamp"
done
echo "built $names in $(( $(date +%s) - start )) s" >&2
