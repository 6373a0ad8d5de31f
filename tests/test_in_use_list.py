"""One in-use list format, read one way: the CLI's ``--in-use-file`` and the agent's
``--in-use-file`` give the same holders, and the agent refuses what the CLI refuses
(a FIFO, a file past the size cap, bad JSON with its line and column)."""

from __future__ import annotations

import os
from pathlib import Path

import click
import pytest

from vgpu_state.agent.cluster import in_use_from_file
from vgpu_state.cli.common import parse_in_use
from vgpu_state.inputfiles import MAX_IN_USE_BYTES
from vgpu_state.kube.errors import PodResourcesUnavailableError

UUID = "f715f63c-0d00-4007-9c5a-b07b0c6c05de"


@pytest.mark.parametrize(
    "text",
    [
        f'{{"{UUID}": "vm default/win-1", "0000:81:00.4": "pod ml/a"}}\n',
        f"# held\n{UUID} vm default/win-1\n0000:81:00.4 pod ml/a\n",
    ],
    ids=["json", "lines"],
)
def test_the_cli_and_the_agent_read_the_same_holders(tmp_path: Path, text: str) -> None:
    path = tmp_path / "in-use"
    path.write_text(text)
    expected = {UUID: "vm default/win-1", "0000:81:00.4": "pod ml/a"}
    assert parse_in_use((), str(path)) == expected
    assert dict(in_use_from_file(str(path))()) == expected


def test_bad_json_names_line_and_column_for_both(tmp_path: Path) -> None:
    path = tmp_path / "in-use.json"
    path.write_text('{\n  "a": "b",\n  "c" "d"\n}\n')
    with pytest.raises(click.BadParameter, match=rf"{path}:3:7: Expecting ':' delimiter"):
        parse_in_use((), str(path))
    with pytest.raises(PodResourcesUnavailableError, match=rf"{path}:3:7: Expecting ':'"):
        in_use_from_file(str(path))()


def test_the_agent_refuses_a_fifo_and_an_oversized_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(PodResourcesUnavailableError, match="must be a regular file, not a FIFO"):
        in_use_from_file(str(fifo))()  # returns at once: nothing is opened for reading
    big = tmp_path / "big"
    big.write_bytes(b"#" * (MAX_IN_USE_BYTES + 1))
    with pytest.raises(PodResourcesUnavailableError, match="more than the limit of 4 MiB"):
        in_use_from_file(str(big))()
