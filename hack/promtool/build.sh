#!/bin/sh
# Puts Prometheus's promtool into hack/promtool/bin/ (ignored by git; or
# $VGPU_STATE_PROMTOOL_BIN). The suite runs it to check and unit-test
# deploy/monitoring's alerting rules (promtool check rules, promtool test rules)
# and to check the agent's and the controller's /metrics output (promtool check
# metrics). Test infrastructure only.
#
# Where apt is (Debian, Ubuntu): the promtool program of the distribution's
# prometheus package, taken out of the package file (apt-get download, then
# dpkg-deb), in seconds. Nothing is installed: no Prometheus server, no service,
# no system user. Elsewhere, or with VGPU_STATE_PROMTOOL_FROM=go: built from the
# Go module proxy, the version go.mod pins (about 23 minutes cold on 2 cores,
# bench/RESULTS.md). Done again only when its source changed: the package's
# version, or go.mod, go.sum and the Go version; and this script.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
bin=${VGPU_STATE_PROMTOOL_BIN:-$here/bin}
mkdir -p "$bin"
out="$bin/promtool"
me="hack/promtool/build.sh"
script_key=$(cksum < build.sh)

up_to_date() {
    [ -x "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$1" ]
}

# The candidate version of the prometheus package, empty when apt knows none.
debian_version() {
    apt-cache policy prometheus 2>/dev/null | sed -n 's/^ *Candidate: *//p' | grep -v '^(none)$' || true
}

from_debian() {
    command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1 || return 1
    version=$(debian_version)
    if [ -z "$version" ] && [ "$(id -u)" = 0 ]; then
        # No package lists yet (a fresh machine): read them once.
        apt-get update -qq >/dev/null 2>&1 || true
        version=$(debian_version)
    fi
    [ -n "$version" ] || return 1
    key="debian prometheus $version $script_key"
    if up_to_date "$key"; then
        echo "promtool: cached (Debian's prometheus $version)" >&2
        return 0
    fi
    start=$(date +%s)
    tmp=$(mktemp -d)
    # apt's download user writes into the directory when it can.
    chmod 755 "$tmp"
    if ! (cd "$tmp" && apt-get download -q "prometheus=$version") >"$tmp/log" 2>&1 ||
        ! dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -xOf - ./usr/bin/promtool >"$out.tmp.$$" ||
        ! [ -s "$out.tmp.$$" ]; then
        echo "$me: could not take promtool out of Debian's prometheus $version:" >&2
        cat "$tmp/log" >&2
        rm -rf "$tmp" "$out.tmp.$$"
        return 1
    fi
    rm -rf "$tmp"
    chmod 755 "$out.tmp.$$"
    mv "$out.tmp.$$" "$out"
    echo "$key" > "$out.stamp"
    echo "promtool: taken from Debian's prometheus $version in $(( $(date +%s) - start )) s" >&2
}

from_go() {
    GO=${GO:-go}
    command -v "$GO" >/dev/null 2>&1 || {
        echo "$me: no Debian package to take promtool from, and Go is not installed (need go >= 1.26)" >&2
        return 127
    }
    # Contents, not times: a checkout or rebase touches files without changing them.
    key=$( { cat go.mod go.sum; "$GO" env GOVERSION; echo "$script_key"; } | cksum)
    if up_to_date "$key"; then
        echo "promtool: cached (built with Go)" >&2
        return 0
    fi
    echo "$me: building promtool with Go (about 25 minutes with empty Go caches)" >&2
    start=$(date +%s)
    log=$(mktemp)
    # -trimpath and no VCS stamp: the same sources give the same binary anywhere.
    # Quiet when it works (the module downloads); all of it when it fails.
    if ! "$GO" build -trimpath -buildvcs=false -ldflags "-s -w" \
        -o "$out.tmp.$$" github.com/prometheus/prometheus/cmd/promtool >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log" "$out.tmp.$$"
        return 1
    fi
    rm -f "$log"
    mv "$out.tmp.$$" "$out"
    echo "$key" > "$out.stamp"
    echo "promtool: built with Go in $(( $(date +%s) - start )) s" >&2
}

if [ "${VGPU_STATE_PROMTOOL_FROM:-}" != go ] && from_debian; then
    exit 0
fi
from_go
