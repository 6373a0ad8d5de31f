"""``vgpu-state fleet snapshot``, and where ``fleet plan`` reads a fleet from: the cluster,
or a snapshot file (``--from``; :mod:`vgpu_state.kube.fleetsnapshot`)."""

from __future__ import annotations

import contextlib
import datetime
import gzip
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING

import click

from vgpu_state.cli.common import handle_errors
from vgpu_state.cli.options import chunk_size_option, kubeconfig_options
from vgpu_state.kube.fleet import DEFAULT_CHUNK_SIZE

if TYPE_CHECKING:
    from vgpu_state.kube.api import KubeApi
    from vgpu_state.kube.fleet import Page
    from vgpu_state.kube.fleetsnapshot import SnapshotReader


class FleetSource:
    """The fleet ``fleet plan`` plans: every Node's labels and the ``VGPUNodeState``
    objects page by page, from the cluster or from a snapshot file, and the moment they
    stand for (now, or when the snapshot was taken)."""

    def __init__(self, api: KubeApi | None, reader: SnapshotReader | None) -> None:
        self.api = api
        self.reader = reader
        if reader is not None:
            assert reader.header is not None
            self.now = reader.header.taken_at
        else:
            self.now = datetime.datetime.now(tz=datetime.UTC)

    @classmethod
    def open(cls, snapshot: str | None, kubeconfig: str | None, context: str | None) -> FleetSource:
        if snapshot is None:
            from vgpu_state.kube.api import KubeApi

            return cls(KubeApi.connect(kubeconfig, context), None)
        if kubeconfig is not None or context is not None:
            raise click.UsageError(
                "--from plans from the snapshot file alone: --kubeconfig and --context "
                "cannot be given with it"
            )
        from vgpu_state.kube.fleetsnapshot import SnapshotReader

        reader = SnapshotReader(snapshot)
        try:
            reader.open()
        except BaseException:
            reader.close()
            raise
        return cls(None, reader)

    def read(self, chunk_size: int) -> tuple[dict[str, dict[str, str]], Iterator[Page]]:
        """Every Node's labels, and the ``VGPUNodeState`` objects page by page (from the
        cluster, each page's JSON text, decoded by whichever process plans it)."""
        if self.reader is not None:
            return self.reader.labels, self.reader.pages(chunk_size)
        from vgpu_state.kube.fleet import fleet_pages

        assert self.api is not None
        return fleet_pages(self.api, chunk_size, raw=True)

    @property
    def description(self) -> str:
        """Where the fleet was read: ``https://…`` or ``snapshot of https://…``."""
        if self.reader is not None:
            assert self.reader.header is not None
            server = self.reader.header.server or "an unnamed cluster"
            return f"snapshot of {server}"
        assert self.api is not None
        return self.api.server

    def close(self) -> None:
        if self.api is not None:
            self.api.close()
        if self.reader is not None:
            self.reader.close()


@contextlib.contextmanager
def _output(path: str) -> Iterator[IO[bytes]]:
    """Standard output for ``-``; else a temporary file beside ``path``, renamed over it
    once complete (gzip-compressed when ``path`` ends in ``.gz``), removed on failure."""
    if path == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".fleet-snapshot-")
    try:
        with os.fdopen(fd, "wb") as raw:
            if path.endswith(".gz"):
                with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as packed:
                    yield packed  # type: ignore[misc]
            else:
                yield raw
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


@click.command("snapshot")
@click.option(
    "--out",
    "out_file",
    default="-",
    show_default=True,
    metavar="FILE",
    help="Where to write the snapshot (- for standard output; a name ending in .gz is "
    "gzip-compressed).",
)
@kubeconfig_options()
@chunk_size_option(DEFAULT_CHUNK_SIZE)
@handle_errors
def snapshot_cmd(
    out_file: str, kubeconfig: str | None, context: str | None, chunk_size: int
) -> None:
    """Write what fleet plan reads from the cluster to a file (reads only).

    Every Node's labels and every VGPUNodeState's status, as JSON Lines: a
    header (format version, time, API server), one line per Node, one per
    VGPUNodeState, an end line. `fleet plan --from FILE` plans from it with no
    cluster access, as it would have planned against the cluster when the
    snapshot was taken. It needs get and list on nodes and vgpunodestates only
    (docs/gitops.md has the ClusterRole). The file is written beside FILE and
    renamed over it once complete.

    \b
    Examples:
      vgpu-state fleet snapshot --out fleet.jsonl
      vgpu-state fleet snapshot --context prod --out fleet.jsonl.gz
      vgpu-state fleet plan -f layouts.yaml --from fleet.jsonl
    """
    from vgpu_state.kube.api import KubeApi
    from vgpu_state.kube.fleetsnapshot import write_snapshot

    api = KubeApi.connect(kubeconfig, context)
    try:
        with _output(out_file) as out:
            counts = write_snapshot(api, out, context=context, chunk_size=chunk_size)
    finally:
        api.close()
    where = "standard output" if out_file == "-" else out_file
    click.echo(
        f"Fleet snapshot of {api.server}: {counts.nodes} Node(s), {counts.states} "
        f"VGPUNodeState(s), written to {where}.",
        err=True,
    )
