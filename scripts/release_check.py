"""The version each built release artifact carries, against pyproject.toml's.

    python3 scripts/release_check.py --dist build/dist --image build/vgpu-state-1.2.3.oci.tar \
        --chart build/chart [--tag v1.2.3]

One line per artifact (the wheel, the sdist, the image, the Helm chart) and for the tree
(every place scripts/set_version.py lists): what it says and OK or what it differs from;
exit 1 when any differs or is missing. `make release-check` builds the artifacts and runs it;
the release workflow runs it on what it is about to publish.

The image is read from its OCI archive without running it: the tag it was saved under,
its org.opencontainers.image.version label and the version of the package installed in
it (the dist-info METADATA that `vgpu-state --version` prints). Standard library only.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from email.parser import HeaderParser
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import set_version

IMAGE_METADATA = re.compile(
    r"^(?:\./)?opt/vgpu-state/lib/python3[.0-9]*/site-packages/vgpu_state-[^/]+\.dist-info/METADATA$"
)
Result = tuple[str, str, str]  # (artifact, where, version or a reason it has none)


def metadata_version(text: str) -> str:
    return str(HeaderParser().parsestr(text).get("Version", "(no Version field)"))


def wheels(dist: Path) -> Iterator[Result]:
    found = sorted(dist.glob("*.whl"))
    if not found:
        yield ("wheel", str(dist), "(missing)")
    for wheel in found:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
            text = z.read(names[0]).decode() if names else ""
        yield ("wheel", str(wheel), metadata_version(text) if names else "(no METADATA)")


def sdists(dist: Path) -> Iterator[Result]:
    found = sorted(dist.glob("*.tar.gz"))
    if not found:
        yield ("sdist", str(dist), "(missing)")
    for sdist in found:
        with tarfile.open(sdist) as tar:
            member = next((m for m in tar if m.name.count("/") == 1
                           and m.name.endswith("/PKG-INFO")), None)  # fmt: skip
            file = tar.extractfile(member) if member else None
            text = file.read().decode() if file else ""
        yield ("sdist", str(sdist), metadata_version(text) if text else "(no PKG-INFO)")


def _blob(tar: tarfile.TarFile, digest: str) -> bytes:
    algorithm, _, value = digest.partition(":")
    file = tar.extractfile(f"blobs/{algorithm}/{value}")
    if file is None:
        raise ValueError(f"no blob {digest}")
    return file.read()


def image(archive: Path) -> Iterator[Result]:
    if not archive.is_file():
        yield ("image", str(archive), "(missing: make image, as root)")
        return
    with tarfile.open(archive) as tar:
        index = json.loads(_blob_or_file(tar, "index.json"))
        (descriptor,) = index["manifests"]
        ref = descriptor.get("annotations", {}).get("org.opencontainers.image.ref.name", "")
        yield ("image tag", f"{archive}: {ref}", ref.rpartition(":")[2] or "(no tag)")
        manifest = json.loads(_blob(tar, descriptor["digest"]))
        config = json.loads(_blob(tar, manifest["config"]["digest"]))
        labels = config.get("config", {}).get("Labels") or {}
        yield (
            "image label",
            f"{archive}: org.opencontainers.image.version",
            labels.get("org.opencontainers.image.version", "(no label)"),
        )
        installed = "(no vgpu_state dist-info)"
        for layer in manifest["layers"]:  # the last layer that has it wins
            with tarfile.open(fileobj=io.BytesIO(_blob(tar, layer["digest"]))) as files:
                for member in files:
                    if IMAGE_METADATA.match(member.name):
                        file = files.extractfile(member)
                        if file is not None:
                            installed = metadata_version(file.read().decode())
        yield ("image package", f"{archive}: /opt/vgpu-state (vgpu-state --version)", installed)


def _blob_or_file(tar: tarfile.TarFile, name: str) -> bytes:
    file = tar.extractfile(name)
    if file is None:
        raise ValueError(f"no {name}")
    return file.read()


def charts(directory: Path) -> Iterator[Result]:
    found = sorted(directory.glob("*.tgz"))
    if not found:
        yield ("chart", str(directory), "(missing)")
    for chart in found:
        with tarfile.open(chart) as tar:
            member = next((m for m in tar if m.name.endswith("/Chart.yaml")
                           and m.name.count("/") == 1), None)  # fmt: skip
            file = tar.extractfile(member) if member else None
            text = file.read().decode() if file else ""
        for key in ("version", "appVersion"):
            match = re.search(rf'^{key}: "?([^"\s]+)"?\s*$', text, re.M)
            yield (f"chart {key}", f"{chart}: Chart.yaml", match[1] if match else "(none)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist", type=Path, required=True, help="the wheel's and sdist's dir")
    parser.add_argument("--image", type=Path, required=True, help="the image's OCI archive")
    parser.add_argument("--chart", type=Path, required=True, help="the packaged chart's dir")
    parser.add_argument("--tag", help="the git tag being released: must be v<version>")
    args = parser.parse_args(argv)
    version = set_version.source_version()
    places = set_version.places()
    # The tree: one line when every place agrees (scripts/set_version.py lists them),
    # else one per place that differs.
    results: list[Result] = [
        ("tree", str(p.path.relative_to(set_version.REPO)) + f":{p.line}", p.version)
        for p in places
        if p.version != version
    ] or [("tree", f"{len(places)} places (python3 scripts/set_version.py)", version)]
    if args.tag is not None:
        results.append(("git tag", args.tag, args.tag.removeprefix("v")
                        if args.tag.startswith("v") else f"{args.tag} (no v)"))  # fmt: skip
    results += [*wheels(args.dist), *sdists(args.dist), *image(args.image), *charts(args.chart)]
    width = max(len(a) for a, _, _ in results)
    bad = 0
    for artifact, where, found in results:
        ok = found == version
        bad += not ok
        print(f"{artifact:<{width}}  {found:<12} {'OK' if ok else f'differs from {version}'}"
              f"  {where}")  # fmt: skip
    if bad:
        print(f"release-check: {bad} of {len(results)} differ from {version} (pyproject.toml)")
    else:
        print(f"release-check: OK, every artifact and place says {version}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
