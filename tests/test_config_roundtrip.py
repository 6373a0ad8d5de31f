# ruff: noqa: E501
"""Valid documents: table of accepted forms, and hypothesis properties of load/dump."""

from __future__ import annotations

import io
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from vgpu_state.catalog import default_catalog
from vgpu_state.config import ConfigDocument, dump, load_text
from vgpu_state.model import ConfigError, InUsePolicy, Policy, SriovPolicy
from vgpu_state.model.policy import Evacuation

CATALOG = default_catalog()

H = "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: "


@pytest.mark.parametrize(
    ("text", "check"),
    [
        (H + "{A10-4Q: 6}\n", lambda d: d.configs["c"].entries[0].vgpu_devices == {"A10-4Q": 6}),
        (H + "{}\n", lambda d: d.configs["c"].entries[0].vgpu_devices == {}),
        (H + "{'NVIDIA A10-4Q': 6}\n", lambda d: "NVIDIA A10-4Q" in d.configs["c"].entries[0].vgpu_devices),
        (H + "{GRID T4-1Q: 16}\n", lambda d: d.configs["c"].entries[0].vgpu_devices == {"GRID T4-1Q": 16}),
        (H + "{M60-0Q: 1}\n", lambda d: True),
        (H + "{T4-1B: 16}\n", lambda d: True),
        (H + "{T4-2B4: 8}\n", lambda d: True),
        (H + "{DC-1-24CGFX: 4}\n", lambda d: True),
        (H + "{L40S-4Q: 8, L40S-4C: 4}\n", lambda d: True),
        (H + "{A100-3-20C: 2}\n", lambda d: True),
        (
            "version: v1\nvgpu-configs:\n  c:\n    - devices: [0, 2, 3b:00.0]\n"
            "      device-filter: 0x223610de\n      vgpu-devices: {A10-4Q: 6}\n",
            lambda d: d.configs["c"].entries[0].devices == (0, 2, "0000:3b:00.0")
            and d.configs["c"].entries[0].device_filter == ("0x223610DE",),
        ),
        (
            "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n"
            "      device-filter: ['0x25B610DE:0x157e10de', '0x25B610DE']\n"
            "      vgpu-devices: {A2-4Q: 4}\n",
            lambda d: d.configs["c"].entries[0].device_filter
            == ("0x25B610DE:0x157E10DE", "0x25B610DE"),
        ),
        (
            "version: v1\npolicy: {in-use: ignore}\nvgpu-configs:\n  c:\n    policy: {prune: true}\n"
            "    entries:\n      - devices: all\n        vgpu-devices: {A10-4Q: 6}\n",
            lambda d: d.policy_for("c")
            == Policy(in_use=InUsePolicy.IGNORE, prune=True, sriov=SriovPolicy.AUTO),
        ),
        (
            "version: v1\npolicy:\n  in-use: evacuate\n  evacuation: {max-in-flight: 0, "
            "max-per-node: 2, timeout: 90s}\nvgpu-configs:\n  c:\n    policy:\n"
            "      evacuation: {timeout: 1h, restart: true}\n    entries:\n"
            "      - devices: all\n        vgpu-devices: {A10-4Q: 6}\n",
            lambda d: d.policy_for("c")
            == Policy(
                in_use=InUsePolicy.EVACUATE,
                evacuation=Evacuation(
                    max_in_flight=0, max_per_node=2, timeout_seconds=3600, restart=True
                ),
            ),
        ),
        (
            "version: v1\npolicy: {sriov: 'off', prune: true}\nvgpu-configs:\n  c:\n"
            "    policy: {prune: false}\n    entries:\n      - devices: all\n"
            "        vgpu-devices: {A10-4Q: 6}\n",
            lambda d: d.policy_for("c") == Policy(prune=False, sriov=SriovPolicy.OFF),
        ),
        (H + "{A10-4Q: 6}\n", lambda d: d.policy_for("c") == Policy()),
    ],
)
def test_valid_document(text: str, check: Any) -> None:
    assert check(load_text(text, "f.yaml", catalog=CATALOG))


def test_positions_are_recorded() -> None:
    doc = load_text(H + "{A10-4Q: 6}\n", "f.yaml", catalog=CATALOG)
    assert doc.entry_ref("c", 0) == "f.yaml:4:7 (vgpu-configs.c[0])"


def test_documents_compare_by_content_only() -> None:
    a = load_text(H + "{A10-4Q: 6}\n", "a.yaml", catalog=CATALOG)
    b = load_text("# comment\n\n" + H + "{A10-4Q: 6}\n", "b.yaml", catalog=CATALOG)
    assert a == b


# hypothesis ------------------------------------------------------------------

_CAT = default_catalog()
_LAYOUTS = [
    (m, t)
    for m in _CAT.models
    for t in m.types
    if not t.is_mig and len(_CAT.models_for_device(m.device_ids[0])) == 1
]
NAMES = st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True)
LABEL = st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True)


@st.composite
def entries(draw: st.DrawFn) -> dict[str, Any]:
    model, vtype = draw(st.sampled_from(_LAYOUTS))
    entry: dict[str, Any] = {}
    entry["devices"] = draw(
        st.one_of(
            st.just("all"),
            st.lists(st.integers(0, 15), min_size=1, max_size=4, unique=True),
            st.lists(
                st.integers(0, 255).map(lambda b: f"0000:{b:02x}:00.0"),
                min_size=1,
                max_size=3,
                unique=True,
            ),
        )
    )
    if draw(st.booleans()):
        entry["device-filter"] = model.device_filters[0]
    entry["vgpu-devices"] = {vtype.name: draw(st.integers(1, vtype.max_instances))}
    return entry


POLICIES = st.fixed_dictionaries(
    {},
    optional={
        "in-use": st.sampled_from(["protect", "ignore"]),
        "prune": st.booleans(),
        "sriov": st.sampled_from(["auto", "off"]),
    },
)


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
    configs: dict[str, Any] = {}
    for name in names:
        listed = draw(st.lists(entries(), min_size=1, max_size=3))
        if draw(st.booleans()):
            configs[name] = {"policy": draw(POLICIES), "entries": listed}
        else:
            configs[name] = listed
    data: dict[str, Any] = {"version": "v1", "vgpu-configs": configs}
    if draw(st.booleans()):
        data["default"] = draw(st.sampled_from(names))
    if draw(st.booleans()):
        data["policy"] = draw(POLICIES)
    selectors = []
    for _ in range(draw(st.integers(0, 2))):
        selector: dict[str, Any] = {"config": draw(st.sampled_from(names))}
        selector["match-labels"] = draw(st.dictionaries(LABEL, LABEL, max_size=2))
        if draw(st.booleans()):
            selector["match-expressions"] = [
                {"key": draw(LABEL), "operator": "In", "values": [draw(LABEL)]},
                {"key": draw(LABEL), "operator": "DoesNotExist"},
            ]
        selectors.append(selector)
    if selectors:
        data["node-selectors"] = selectors
    return data


def to_yaml(data: dict[str, Any]) -> str:
    yaml = YAML(typ="safe", pure=True)
    stream = io.StringIO()
    yaml.dump(data, stream)
    return stream.getvalue()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents())
def test_load_dump_load_is_identity(data: dict[str, Any]) -> None:
    first = load_text(to_yaml(data), "gen.yaml", catalog=CATALOG)
    text = dump(first)
    second = load_text(text, "dumped.yaml", catalog=CATALOG)
    assert second == first
    assert dump(second) == text


MUTATION_CHARS = st.sampled_from([*":-[]{}#&*!|>'\"%@`,? \n\t0aZ", "  ", "- ", ": "])


@st.composite
def mutated(draw: st.DrawFn) -> str:
    text = to_yaml(draw(documents()))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["delete", "insert", "replace", "dup_line", "drop_line"]))
        at = draw(st.integers(0, max(len(text) - 1, 0)))
        if kind == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 8)) :]
        elif kind == "insert":
            text = text[:at] + draw(MUTATION_CHARS) + text[at:]
        elif kind == "replace":
            text = text[:at] + draw(MUTATION_CHARS) + text[at + 1 :]
        else:
            lines = text.splitlines(keepends=True)
            if lines:
                i = draw(st.integers(0, len(lines) - 1))
                lines[i : i + 1] = [lines[i], lines[i]] if kind == "dup_line" else []
                text = "".join(lines)
    return text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutations_raise_only_config_error(text: str) -> None:
    try:
        result = load_text(text, "mutated.yaml", catalog=CATALOG)
    except ConfigError as exc:
        assert exc.issues
        for issue in exc.issues:
            assert issue.file == "mutated.yaml" and issue.line >= 1 and issue.column >= 1
        return
    assert isinstance(result, ConfigDocument)
