"""The one version string and every place that spells it (docs/release.md).

pyproject.toml's ``version`` is the source; the Helm chart's ``version`` and
``appVersion``, deploy/'s image tag and the install commands of the docs carry the same
string. tests/test_release.py fails when one differs.

    python3 scripts/set_version.py            # list every place and its version
    python3 scripts/set_version.py --check    # the same; exit 1 when one differs
    python3 scripts/set_version.py --check --tag v1.2.3   # and the tag is v<version>
    python3 scripts/set_version.py 1.2.3      # the release commit: write it everywhere

Standard library only: the release workflow runs it before anything is installed.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# A release version: X.Y.Z, which PEP 440 (the package), SemVer (the chart's version)
# and an image tag all spell alike. Pre-release spellings differ between PEP 440
# (1.0.0rc1) and SemVer (1.0.0-rc.1), so there are none.
RELEASE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")


def _v(name: str = "version") -> str:
    """A version as a named group, ended by anything a version cannot hold."""
    return rf"(?P<{name}>[0-9][0-9A-Za-z.+-]*?)(?![0-9A-Za-z.+-])"


SOURCE = "pyproject.toml"

# (files, pattern): each match's ``version`` group is one place the version is spelled.
PLACES: tuple[tuple[tuple[str, ...], re.Pattern[str]], ...] = (
    ((SOURCE,), re.compile(rf'^version = "{_v()}"', re.M)),
    (("deploy/helm/vgpu-state/Chart.yaml",), re.compile(rf"^version: {_v()}$", re.M)),
    (("deploy/helm/vgpu-state/Chart.yaml",), re.compile(rf'^appVersion: "{_v()}"$', re.M)),
    (("deploy/kustomization.yaml",), re.compile(rf'^    newTag: "{_v()}"$', re.M)),
    # The install commands of the docs: the image, the chart, deploy/ at the release's
    # tag, the pre-commit hook's rev and the package from PyPI.
    (
        ("README.md", "docs/*.md", "examples/**/*.yml", "examples/**/*.yaml", "examples/**/*.md"),
        re.compile(
            rf"ghcr\.io/vgpu-state/vgpu-state:{_v('image')}"
            rf"|oci://ghcr\.io/vgpu-state/charts/vgpu-state --version {_v('chart')}"
            rf"|github\.com/vgpu-state/vgpu-state//deploy\?ref=v{_v('deploy')}"
            rf"|^\s*rev: v{_v('rev')}$"
            rf"|vgpu-state==\s*{_v('pip')}",
            re.M,
        ),
    ),
)


@dataclass(frozen=True)
class Place:
    path: Path
    line: int
    column: int
    version: str
    start: int
    end: int

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}:{self.column}: {self.version}"


def _files(repo: Path, globs: tuple[str, ...]) -> list[Path]:
    found: dict[Path, None] = {}
    for pattern in globs:
        for path in sorted(repo.glob(pattern)):
            if path.is_file():
                found[path] = None
    return list(found)


def places(repo: Path = REPO) -> list[Place]:
    """Every place the version is spelled, in file order; the source first."""
    out: list[Place] = []
    for globs, pattern in PLACES:
        for path in _files(repo, globs):
            text = path.read_text(encoding="utf-8")
            for match in pattern.finditer(text):
                group = next(g for g, v in match.groupdict().items() if v is not None)
                start, end = match.span(group)
                line = text.count("\n", 0, start) + 1
                column = start - (text.rfind("\n", 0, start) + 1) + 1
                out.append(Place(path, line, column, match.group(group), start, end))
    return out


def source_version(repo: Path = REPO) -> str:
    found = [p for p in places(repo) if p.path.name == SOURCE and p.path.parent == repo]
    if not found:
        raise SystemExit(f"{repo / SOURCE}: no 'version = \"X.Y.Z\"' line in [project]")
    return found[0].version


def differing(repo: Path = REPO) -> list[Place]:
    """The places whose version is not the source's."""
    version = source_version(repo)
    return [p for p in places(repo) if p.version != version]


def write(version: str, repo: Path = REPO) -> list[Place]:
    """Spell ``version`` in every place; returns the places changed."""
    if not RELEASE.fullmatch(version):
        raise SystemExit(
            f"{version!r} is not a release version X.Y.Z (numbers only: the package, "
            "the chart and the image spell pre-releases differently)"
        )
    changed = [p for p in places(repo) if p.version != version]
    by_file: dict[Path, list[Place]] = {}
    for place in changed:
        by_file.setdefault(place.path, []).append(place)
    for path, found in by_file.items():
        text = path.read_text(encoding="utf-8")
        for place in sorted(found, key=lambda p: p.start, reverse=True):
            text = text[: place.start] + version + text[place.end :]
        path.write_text(text, encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", nargs="?", help="write this X.Y.Z everywhere")
    parser.add_argument("--check", action="store_true", help="exit 1 when a place differs")
    parser.add_argument("--tag", help="with --check: the git tag must be v<version>")
    args = parser.parse_args(argv)
    if args.version:
        for place in write(args.version):
            print(f"{place.path.relative_to(REPO)}:{place.line}: {place.version} -> {args.version}")
        return 0
    version = source_version()
    bad = differing()
    for place in places():
        print(f"{place}  {'OK' if place.version == version else f'differs from {version}'}")
    if args.tag is not None and args.tag != f"v{version}":
        print(f"the tag {args.tag} is not v{version} (pyproject.toml's version)")
        return 1
    if bad:
        print(f"{len(bad)} place(s) differ from {SOURCE}'s {version}: "
              f"python3 scripts/set_version.py {version}")  # fmt: skip
        return 1 if args.check else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
