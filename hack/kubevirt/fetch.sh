#!/bin/sh
# Puts KubeVirt's OpenAPI document (api/openapi-spec/swagger.json of the
# kubevirt.io/kubevirt module) into hack/kubevirt/bin/ (ignored by git; or
# $VGPU_STATE_KUBEVIRT_BIN). The evacuation tests build the CRDs of
# VirtualMachine, VirtualMachineInstance and VirtualMachineInstanceMigration from
# it (tests/realcluster.py), so the real kube-apiserver checks those objects
# against KubeVirt's own schemas. Only the module's zip is downloaded, from the
# Go module proxy (no Go needed); nothing of it is kept but that one file.
# Done again only when the version or this script changed. Test infrastructure only.
#   hack/kubevirt/fetch.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
VERSION=${VGPU_STATE_KUBEVIRT_VERSION:-v1.9.0}
bin=${VGPU_STATE_KUBEVIRT_BIN:-$here/bin}
mkdir -p "$bin"
out="$bin/swagger.json"
key="kubevirt.io/kubevirt $VERSION $(cksum < fetch.sh)"
if [ -s "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$key" ]; then
    echo "KubeVirt OpenAPI $VERSION: cached" >&2
    exit 0
fi
command -v curl >/dev/null 2>&1 || { echo "hack/kubevirt/fetch.sh: curl is not installed" >&2; exit 127; }
command -v unzip >/dev/null 2>&1 || command -v python3 >/dev/null 2>&1 || {
    echo "hack/kubevirt/fetch.sh: neither unzip nor python3 is installed" >&2; exit 127; }
proxy=${GOPROXY:-https://proxy.golang.org}
proxy=${proxy%%,*}
[ "$proxy" = direct ] || [ "$proxy" = off ] && proxy=https://proxy.golang.org
start=$(date +%s)
tmp=$(mktemp -d "$bin/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
member="kubevirt.io/kubevirt@$VERSION/api/openapi-spec/swagger.json"
curl -sSfL --retry 3 -o "$tmp/module.zip" "$proxy/kubevirt.io/kubevirt/@v/$VERSION.zip"
if command -v unzip >/dev/null 2>&1; then
    unzip -q -p "$tmp/module.zip" "$member" > "$tmp/swagger.json"
else
    python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
        "$tmp/module.zip" "$member" > "$tmp/swagger.json"
fi
[ -s "$tmp/swagger.json" ] || { echo "hack/kubevirt/fetch.sh: $member is empty" >&2; exit 1; }
mv "$tmp/swagger.json" "$out"
printf '%s\n' "$key" > "$out.stamp"
echo "fetched KubeVirt OpenAPI $VERSION in $(( $(date +%s) - start )) s" >&2
