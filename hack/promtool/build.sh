#!/bin/sh
# Builds Prometheus's promtool from the Go module proxy (the version go.mod pins)
# into hack/promtool/bin/ (ignored by git; or $VGPU_STATE_PROMTOOL_BIN). The suite
# runs it to check and unit-test deploy/monitoring's alerting rules and to check
# the agent's and the controller's /metrics output. Built only when missing or
# built from another go.mod, go.sum, build.sh or Go version. Test infrastructure only.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
GO=${GO:-go}
command -v "$GO" >/dev/null 2>&1 || { echo "hack/promtool/build.sh: Go is not installed (need go >= 1.26)" >&2; exit 127; }
bin=${VGPU_STATE_PROMTOOL_BIN:-$here/bin}
mkdir -p "$bin"
out="$bin/promtool"
# Contents, not times: a checkout or rebase touches files without changing them.
key=$( { cat go.mod go.sum build.sh; "$GO" env GOVERSION; } | cksum)
if [ -x "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$key" ]; then
    exit 0
fi
echo "hack/promtool/build.sh: building promtool" >&2
start=$(date +%s)
# -trimpath and no VCS stamp: the same sources give the same binary anywhere.
"$GO" build -trimpath -buildvcs=false -o "$out.tmp" github.com/prometheus/prometheus/cmd/promtool
mv "$out.tmp" "$out"
echo "$key" > "$out.stamp"
echo "hack/promtool/build.sh: built promtool in $(( $(date +%s) - start )) s" >&2
