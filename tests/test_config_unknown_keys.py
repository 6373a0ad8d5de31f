"""Every mapping of a config file reports a key it does not take in one way.

A misspelt key gets ``did you mean <nearest>?``, any other unknown key the list
of keys that mapping takes, both at the key's own ``file:line:column`` with its
key path.
"""

from __future__ import annotations

import pytest

from vgpu_state.catalog import default_catalog
from vgpu_state.config import load_text
from vgpu_state.model import ConfigError

CATALOG = default_catalog()

# (mapping, the document with KEY where the unknown key goes, where the message says
# it is, its key path, the keys that mapping takes)
SECTIONS = [
    (
        "top level",
        "version: v1\nKEY: 1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {}\n",
        "the top level",
        "KEY",
        ("version", "vgpu-configs", "node-selectors", "default", "policy"),
    ),
    (
        "config",
        "version: v1\nvgpu-configs:\n  c:\n    KEY: 1\n    entries:\n"
        "      - devices: all\n        vgpu-devices: {}\n",
        "config 'c'",
        "vgpu-configs.c.KEY",
        ("entries", "policy"),
    ),
    (
        "entry",
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      KEY: 1\n"
        "      vgpu-devices: {}\n",
        "an entry",
        "vgpu-configs.c[0].KEY",
        ("devices", "device-filter", "vgpu-devices", "publish", "mode", "mig-geometry"),
    ),
    (
        "top-level policy",
        "version: v1\npolicy:\n  KEY: 1\nvgpu-configs:\n  c:\n    - devices: all\n"
        "      vgpu-devices: {}\n",
        "policy",
        "policy.KEY",
        ("in-use", "prune", "sriov", "max-unavailable", "publish", "missing-gpus", "evacuation"),
    ),
    (
        "config policy",
        "version: v1\nvgpu-configs:\n  c:\n    policy: {KEY: 1}\n    entries:\n"
        "      - devices: all\n        vgpu-devices: {}\n",
        "policy",
        "vgpu-configs.c.policy.KEY",
        ("in-use", "prune", "sriov", "max-unavailable", "publish", "missing-gpus", "evacuation"),
    ),
    (
        "evacuation",
        "version: v1\npolicy:\n  evacuation:\n    KEY: 1\nvgpu-configs:\n  c:\n"
        "    - devices: all\n      vgpu-devices: {}\n",
        "evacuation",
        "policy.evacuation.KEY",
        ("max-in-flight", "max-per-node", "timeout", "restart"),
    ),
    (
        "node-selector",
        "version: v1\nnode-selectors:\n  - config: c\n    KEY: 1\nvgpu-configs:\n  c:\n"
        "    - devices: all\n      vgpu-devices: {}\n",
        "a node-selector",
        "node-selectors[0].KEY",
        ("match-labels", "match-expressions", "config"),
    ),
    (
        "match-expression",
        "version: v1\nnode-selectors:\n  - config: c\n    match-expressions:\n"
        "      - {key: k, operator: Exists, KEY: 1}\nvgpu-configs:\n  c:\n"
        "    - devices: all\n      vgpu-devices: {}\n",
        "a match-expression",
        "node-selectors[0].match-expressions[0].KEY",
        ("key", "operator", "values"),
    ),
]
IDS = [s[0] for s in SECTIONS]


def issues(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_text(text, "f.yaml", catalog=CATALOG)
    return [str(i) for i in info.value.issues]


def at(text: str, key: str) -> str:
    """``f.yaml:line:column`` of the first ``key`` in ``text``."""
    before = text[: text.index(key)]
    return f"f.yaml:{before.count(chr(10)) + 1}:{len(before) - before.rfind(chr(10))}"


@pytest.mark.parametrize(("name", "text", "where", "path", "allowed"), SECTIONS, ids=IDS)
def test_a_misspelt_key_gets_the_nearest_key_it_meant(
    name: str, text: str, where: str, path: str, allowed: tuple[str, ...]
) -> None:
    for key in allowed:
        typo = key[:-1] + key[-1] * 2  # "prunee"
        doc = text.replace("KEY", typo)
        expected = (
            f"{at(doc, typo)}: unknown key {typo!r} in {where}; did you mean {key}? "
            f"({path.replace('KEY', typo)})"
        )
        assert issues(doc) == [expected]


@pytest.mark.parametrize(("name", "text", "where", "path", "allowed"), SECTIONS, ids=IDS)
def test_an_unknown_key_gets_the_keys_that_mapping_takes(
    name: str, text: str, where: str, path: str, allowed: tuple[str, ...]
) -> None:
    doc = text.replace("KEY", "zzz")
    expected = (
        f"{at(doc, 'zzz')}: unknown key 'zzz' in {where}; expected one of: "
        f"{', '.join(allowed)} ({path.replace('KEY', 'zzz')})"
    )
    assert issues(doc) == [expected]
