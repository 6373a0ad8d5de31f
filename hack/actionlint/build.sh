#!/bin/sh
# Builds actionlint (github.com/rhysd/actionlint, the version go.mod pins) from the Go
# module proxy into hack/actionlint/bin/ (ignored by git; or $VGPU_STATE_ACTIONLINT_BIN).
# The suite runs it on the workflows in .github/workflows/ (tests/test_release.py).
# Built only when missing or built from another go.mod, go.sum, build.sh or Go
# version. Test infrastructure only.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
GO=${GO:-go}
command -v "$GO" >/dev/null 2>&1 || { echo "hack/actionlint/build.sh: Go is not installed (need go >= 1.26)" >&2; exit 127; }
bin=${VGPU_STATE_ACTIONLINT_BIN:-$here/bin}
mkdir -p "$bin"
out="$bin/actionlint"
# Contents, not times: a checkout or rebase touches files without changing them.
key=$( { cat go.mod go.sum build.sh; "$GO" env GOVERSION; } | cksum)
if [ -x "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$key" ]; then
    exit 0
fi
echo "hack/actionlint/build.sh: building actionlint" >&2
start=$(date +%s)
# -trimpath and no VCS stamp: the same sources give the same binary anywhere.
"$GO" build -trimpath -buildvcs=false -o "$out.tmp" github.com/rhysd/actionlint/cmd/actionlint
mv "$out.tmp" "$out"
echo "$key" > "$out.stamp"
echo "hack/actionlint/build.sh: built actionlint in $(( $(date +%s) - start )) s" >&2
