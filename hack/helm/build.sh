#!/bin/sh
# Builds upstream Helm's command line (helm.sh/helm/v3, the version go.mod pins) from
# the Go module proxy into hack/helm/bin/helm (ignored by git; or $VGPU_STATE_HELM_BIN),
# for the chart tests (helm lint, helm template). Skipped when the binary was built
# from the same go.mod, go.sum and Go version. Test infrastructure only.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
GO=${GO:-go}
command -v "$GO" >/dev/null 2>&1 || { echo "hack/helm/build.sh: Go is not installed (need go >= 1.26)" >&2; exit 127; }
bin=${VGPU_STATE_HELM_BIN:-$here/bin}
mkdir -p "$bin"
out="$bin/helm"
# Up to date when built from the same go.mod, go.sum, this script and Go version
# (contents, not times: a checkout or rebase touches files without changing them).
key=$( { cat go.mod go.sum build.sh; "$GO" env GOVERSION; } | cksum)
if [ -x "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$key" ]; then
    echo "helm: cached" >&2
    exit 0
fi
version=$("$GO" list -m -f '{{.Version}}' helm.sh/helm/v3)
# The Kubernetes version `helm template` and `helm lint` assume, from client-go's
# (v0.N.x is Kubernetes 1.N), as upstream's release build sets it.
kube_minor=$("$GO" list -m -f '{{.Version}}' k8s.io/client-go | cut -d. -f2)
echo "hack/helm/build.sh: building helm $version" >&2
start=$(date +%s)
# -trimpath and no VCS stamp: the same sources give the same binary anywhere; the
# version strings are the ones upstream's release build sets. -s -w: no symbol
# table and no DWARF, a faster link and a smaller binary.
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version"
ldflags="$ldflags -X helm.sh/helm/v3/internal/version.metadata="
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ldflags="$ldflags -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$kube_minor"
done
# A temporary file of this build's own: two test runs may build at once. Quiet
# when it works (the module downloads); all of it when it fails.
log=$(mktemp)
if ! CGO_ENABLED=0 "$GO" build -trimpath -buildvcs=false -ldflags "$ldflags" \
    -o "$out.tmp.$$" helm.sh/helm/v3/cmd/helm >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log" "$out.tmp.$$"
    echo "hack/helm/build.sh: building helm failed" >&2
    exit 1
fi
rm -f "$log"
mv "$out.tmp.$$" "$out"
echo "$key" > "$out.stamp"
echo "built helm $version in $(( $(date +%s) - start )) s" >&2
