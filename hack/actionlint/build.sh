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
    echo "actionlint: cached" >&2
    exit 0
fi
start=$(date +%s)
# -trimpath and no VCS stamp: the same sources give the same binary anywhere; -s -w:
# no symbol table and no DWARF. Quiet when it works; all of the output when it fails.
log=$(mktemp)
if ! CGO_ENABLED=0 "$GO" build -trimpath -buildvcs=false -ldflags "-s -w" \
    -o "$out.tmp.$$" github.com/rhysd/actionlint/cmd/actionlint >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log" "$out.tmp.$$"
    echo "hack/actionlint/build.sh: building actionlint failed" >&2
    exit 1
fi
rm -f "$log"
mv "$out.tmp.$$" "$out"
echo "$key" > "$out.stamp"
echo "built actionlint in $(( $(date +%s) - start )) s" >&2
