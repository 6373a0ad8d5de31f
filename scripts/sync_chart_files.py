#!/usr/bin/env python3
"""Copy the kustomize base's fixed objects into the Helm chart's files/ (deploy/helm/vgpu-state).

The chart renders these files as they are (adding its labels, and putting namespaced
objects in the release's namespace), so the chart and ``deploy/`` install the same CRD,
admission policies, DeviceClass, monitoring objects and default layouts.
Run it after changing one of the sources; ``--check`` exits 1 (naming the stale
files) when a copy differs, as the test suite does.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
FILES = DEPLOY / "helm" / "vgpu-state" / "files"
SOURCES = {
    "crd.yaml": DEPLOY / "crd.yaml",
    "policies.yaml": DEPLOY / "policies.yaml",
    "config.yaml": DEPLOY / "config.yaml",
    "deviceclass.yaml": DEPLOY / "components" / "dra" / "deviceclass.yaml",
    "podmonitor.yaml": DEPLOY / "monitoring" / "podmonitor.yaml",
    "prometheusrule.yaml": DEPLOY / "monitoring" / "prometheusrule.yaml",
}
HEADER = "# Copied from {source} by scripts/sync_chart_files.py; do not edit.\n"


def expected(name: str) -> str:
    source = SOURCES[name]
    text = source.read_text(encoding="utf-8")
    if name == "config.yaml":
        return text  # the ConfigMap's data, byte for byte as the base ships it
    return HEADER.format(source=source.relative_to(REPO)) + text


def stale() -> list[str]:
    return [
        name
        for name in SOURCES
        if not (FILES / name).is_file()
        or (FILES / name).read_text(encoding="utf-8") != expected(name)
    ]


def main(argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        names = stale()
        for name in names:
            print(
                f"{FILES.relative_to(REPO) / name} differs from {SOURCES[name].relative_to(REPO)}: "
                "run scripts/sync_chart_files.py",
                file=sys.stderr,
            )
        return 1 if names else 0
    if argv[1:]:
        print("usage: scripts/sync_chart_files.py [--check]", file=sys.stderr)
        return 2
    FILES.mkdir(parents=True, exist_ok=True)
    for name in SOURCES:
        (FILES / name).write_text(expected(name), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
