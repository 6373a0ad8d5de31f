"""The config document: pydantic models of the file's shape, and the loaded document.

The models mirror the YAML keys (``vgpu-configs``, ``device-filter`` …) through
aliases, so ``ConfigFile.model_json_schema(by_alias=True)`` is the schema of the
file. Loading (``vgpu_state.config.loader``) checks a file node by node and then
builds these models; they never see unchecked input.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, GetJsonSchemaHandler, WithJsonSchema
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from vgpu_state.model.errors import ConfigIssue
from vgpu_state.model.frozen import Frozen
from vgpu_state.model.gpumode import GpuMode
from vgpu_state.model.policy import (
    Evacuation,
    InUsePolicy,
    MissingGpus,
    Policy,
    Publish,
    SriovPolicy,
)

DEVICE_FILTER_PATTERN = r"^0[xX][0-9a-fA-F]{8}(:0[xX][0-9a-fA-F]{8})?$"
PCI_ADDRESS_PATTERN = r"^([0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-1][0-9a-fA-F]\.[0-7]$"
LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
MAX_GPU_INSTANCES = 64
"""The most GPU instances of one profile an entry's mig-geometry may ask for (a GPU has at
most 7 compute slices; the bound keeps a hostile file's numbers small)."""


class _Model(Frozen):
    """A frozen model whose fields are also set by their YAML key (``vgpu-devices``)."""

    model_config = ConfigDict(populate_by_name=True)


PUBLISH_DESCRIPTION = (
    "device-plugin (default): the kubelet device plugin advertises the vGPUs; "
    "dra: they are published as ResourceSlice devices for Dynamic Resource Allocation "
    "instead. A vGPU is offered through exactly one of the two."
)


DURATION_PATTERN = r"^[0-9]{1,6}[smh]$"
"""A duration of the config file: a whole number of seconds, minutes or hours (``90s``,
``10m``, ``1h``)."""
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600}
MIN_EVACUATION_TIMEOUT = 10
MAX_EVACUATION_TIMEOUT = 24 * 3600
MAX_EVACUATION_MOVES = 1000
"""The highest ``max-in-flight`` and ``max-per-node``."""


def duration_seconds(text: str) -> int:
    """The seconds of a duration matching :data:`DURATION_PATTERN` (``10m`` -> 600)."""
    return int(text[:-1]) * DURATION_UNITS[text[-1]]


class EvacuationSpec(_Model):
    """The limits of in-use: evacuate in a config's policy; a key left out inherits the
    top-level value, then the default."""

    max_per_node: int | None = Field(
        default=None,
        alias="max-per-node",
        ge=1,
        le=MAX_EVACUATION_MOVES,
        description="1 (default): VMs moving off one node at once.",
    )
    timeout: str | None = Field(
        default=None,
        pattern=DURATION_PATTERN,
        description="10m (default): a move not finished by then has failed (a duration: "
        "90s, 10m, 1h; from 10s to 24h).",
    )
    restart: bool | None = Field(
        default=None,
        description="false (default): a VM that cannot live-migrate stays; true: it may be "
        "restarted elsewhere.",
    )

    def apply_to(self, base: Evacuation) -> Evacuation:
        """``base`` with every key this spec sets replaced."""
        return Evacuation(
            max_in_flight=base.max_in_flight,
            max_per_node=self.max_per_node if self.max_per_node is not None else base.max_per_node,
            timeout_seconds=(
                duration_seconds(self.timeout) if self.timeout is not None else base.timeout_seconds
            ),
            restart=self.restart if self.restart is not None else base.restart,
        )


class TopEvacuationSpec(EvacuationSpec):
    """The limits of in-use: evacuate in the top-level policy, which alone sets
    max-in-flight; a key left out takes its default."""

    max_in_flight: int | None = Field(
        default=None,
        alias="max-in-flight",
        ge=0,
        le=MAX_EVACUATION_MOVES,
        description="1 (default): VMs moving at once, fleet-wide; 0: withhold the capacity "
        "a switch needs but move no VM. Only at the top level.",
    )

    def apply_to(self, base: Evacuation) -> Evacuation:
        merged = super().apply_to(base)
        if self.max_in_flight is None:
            return merged
        return merged.model_copy(update={"max_in_flight": self.max_in_flight})


class PolicySpec(_Model):
    """Policy knobs; a key left out inherits the top-level value, then the default."""

    in_use: InUsePolicy | None = Field(
        default=None,
        alias="in-use",
        description="protect (default): never destroy a vGPU a pod or VM holds; "
        "ignore: plan as if nothing were in use; evacuate: as protect, and withhold the "
        "free vGPUs a pending switch drops and move the VMs in its way.",
    )
    prune: bool | None = Field(
        default=None,
        description="true (default): the layout is the whole desired state of a GPU it "
        "covers; destroy the vGPUs it does not want (still subject to in-use). "
        "false: additive layouts; leave unwanted vGPUs in place and report them.",
    )
    sriov: SriovPolicy | None = Field(
        default=None,
        description="auto (default): enable a GPU's virtual functions when the layout "
        "needs them; off: never touch SR-IOV.",
    )
    publish: Publish | None = Field(
        default=None,
        description=PUBLISH_DESCRIPTION,
    )

    max_unavailable: int | None = Field(
        default=None,
        alias="max-unavailable",
        ge=1,
        description="1 (default): how many nodes the agents let apply a disruptive "
        "change (one that destroys a vGPU) at the same time.",
    )

    missing_gpus: MissingGpus | None = Field(
        default=None,
        alias="missing-gpus",
        description="skip (default): an entry whose devices or device-filter select no "
        "GPU of the node is skipped and the plan lists it; error: such an entry is an "
        "error (as --strict makes it).",
    )

    evacuation: EvacuationSpec | None = Field(
        default=None,
        description="The limits of in-use: evacuate (max-per-node, timeout, restart).",
    )

    def apply_to(self, base: Policy) -> Policy:
        """``base`` with every key this spec sets replaced."""
        return Policy(
            in_use=self.in_use if self.in_use is not None else base.in_use,
            prune=self.prune if self.prune is not None else base.prune,
            sriov=self.sriov if self.sriov is not None else base.sriov,
            max_unavailable=(
                self.max_unavailable if self.max_unavailable is not None else base.max_unavailable
            ),
            publish=self.publish if self.publish is not None else base.publish,
            missing_gpus=(
                self.missing_gpus if self.missing_gpus is not None else base.missing_gpus
            ),
            evacuation=(
                self.evacuation.apply_to(base.evacuation)
                if self.evacuation is not None
                else base.evacuation
            ),
        )


class TopPolicySpec(PolicySpec):
    """Policy knobs of every config; a config's own policy overrides them key by key."""

    evacuation: TopEvacuationSpec | None = Field(
        default=None,
        description="The limits of in-use: evacuate (max-in-flight, max-per-node, timeout, "
        "restart).",
    )


_DEVICES_SCHEMA: dict[str, Any] = {
    "description": "'all', or a list of GPU indices (0, 1, …) and PCI addresses "
    "(0000:3b:00.0 or 3b:00.0).",
    "anyOf": [
        {"const": "all"},
        {
            "type": "array",
            "minItems": 1,
            "items": {
                "anyOf": [
                    {"type": "integer", "minimum": 0},
                    {"type": "string", "pattern": PCI_ADDRESS_PATTERN},
                ]
            },
        },
    ],
}
_FILTER_ITEM: dict[str, Any] = {"type": "string", "pattern": DEVICE_FILTER_PATTERN}
_FILTER_SCHEMA: dict[str, Any] = {
    "description": "PCI device and vendor id 0xDDDDVVVV, optionally with the subsystem "
    "device and vendor id 0xDDDDVVVV:0xSSSSVVVV; one string or a list (any one matches). "
    '"", [] and null match every GPU, as leaving the key out does.',
    "anyOf": [
        _FILTER_ITEM,
        {"type": "array", "items": _FILTER_ITEM},
        {"type": "string", "maxLength": 0},
        {"type": "null"},
    ],
}


class Entry(_Model):
    """One layout rule of a config: which GPUs, and the vGPU types each gets."""

    devices: Annotated[Literal["all"] | tuple[int | str, ...], WithJsonSchema(_DEVICES_SCHEMA)] = (
        Field(title="Devices")
    )
    device_filter: Annotated[tuple[str, ...], WithJsonSchema(_FILTER_SCHEMA)] = Field(
        default=(), alias="device-filter", title="Device Filter"
    )
    vgpu_devices: dict[str, Annotated[int, Field(gt=0)]] = Field(
        alias="vgpu-devices",
        description="vGPU type name → number of vGPUs of that type on each matching GPU. "
        "{} means no vGPUs.",
    )
    publish: Publish | None = Field(
        default=None,
        description="The channel of this entry's vGPUs; left out: the policy's. "
        + PUBLISH_DESCRIPTION,
    )
    mode: GpuMode | None = Field(
        default=None,
        description="How the GPU shares itself: time-sliced (vGPUs of one framebuffer "
        "size, the driver's default), mixed-size (time-sliced vGPUs of different sizes; "
        "Ada, Hopper and Blackwell GPUs) or mig (MIG-backed vGPUs in GPU instances). "
        "Left out: mig when the types are MIG-backed, else time-sliced.",
    )
    mig_geometry: dict[str, Annotated[int, Field(gt=0, le=MAX_GPU_INSTANCES)]] | None = Field(
        default=None,
        alias="mig-geometry",
        description="Under mode mig: GPU instance profile (1g.24gb, 1g.5gb+me) → number "
        "of GPU instances on each matching GPU. Left out: the fewest GPU instances that "
        "hold the vGPUs (one framebuffer size per GPU instance).",
    )


class NamedConfig(_Model):
    """A named layout: the v1 list of entries, or a mapping with ``entries`` and ``policy``."""

    entries: tuple[Entry, ...] = Field(min_length=1)
    policy: PolicySpec | None = None

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        mapping = handler(core_schema)
        resolved = handler.resolve_ref_schema(mapping)
        entries = dict(resolved["properties"]["entries"])
        entries.pop("title", None)
        return {
            "description": "A list of entries (vgpu-device-manager v1 form), or a mapping "
            "with entries and a policy for this config.",
            "anyOf": [entries, mapping],
        }


class LabelExpression(_Model):
    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()


class NodeSelector(_Model):
    """Nodes whose labels match get ``config`` (when they carry no config label)."""

    match_labels: dict[str, str] = Field(default_factory=dict, alias="match-labels")
    match_expressions: tuple[LabelExpression, ...] = Field(default=(), alias="match-expressions")
    config: str

    def matches(self, labels: Mapping[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for expr in self.match_expressions:
            present = expr.key in labels
            if expr.operator == "In" and not (present and labels[expr.key] in expr.values):
                return False
            if expr.operator == "NotIn" and present and labels[expr.key] in expr.values:
                return False
            if expr.operator == "Exists" and not present:
                return False
            if expr.operator == "DoesNotExist" and present:
                return False
        return True


class ConfigFile(_Model):
    """vgpu-state config file (a superset of NVIDIA vgpu-device-manager version v1)."""

    model_config = ConfigDict(title="vgpu-state config")

    version: Literal["v1"]
    vgpu_configs: dict[str, NamedConfig] = Field(
        alias="vgpu-configs", min_length=1, description="Named layouts."
    )
    node_selectors: tuple[NodeSelector, ...] = Field(
        default=(),
        alias="node-selectors",
        description="Label selectors → config name; the first match wins.",
    )
    default: str | None = Field(
        default=None, description="The config of nodes no label or node-selector picks."
    )
    policy: TopPolicySpec | None = None


@dataclass(frozen=True)
class ConfigDocument:
    """A loaded, valid config file.

    Two documents are equal when their content is; the file name and the
    positions of the nodes do not take part.
    """

    spec: ConfigFile
    file: str = field(default="<config>", compare=False)
    positions: Mapping[str, tuple[int, int]] = field(default_factory=dict, compare=False)
    """Key path (``vgpu-configs.a10[0]``, ``node-selectors[1]``, ``default``) → (line, column)."""
    warnings: tuple[ConfigIssue, ...] = field(default=(), compare=False)
    """What the catalog cannot vouch for (type names it does not know); not errors."""
    notes: tuple[ConfigIssue, ...] = field(default=(), compare=False)
    """Entries whose layout rests on an inferred rule (``experimental: inferred, not
    verified on hardware``): MIG GPU instances, mixed-size placement. Never errors."""

    @property
    def configs(self) -> dict[str, NamedConfig]:
        return self.spec.vgpu_configs

    @property
    def config_names(self) -> tuple[str, ...]:
        return tuple(self.spec.vgpu_configs)

    def policy_for(self, name: str) -> Policy:
        """The effective policy of config ``name``: defaults ← top level ← the config's own."""
        policy = Policy()
        if self.spec.policy is not None:
            policy = self.spec.policy.apply_to(policy)
        own = self.spec.vgpu_configs[name].policy
        return own.apply_to(policy) if own is not None else policy

    def location(self, path: str) -> str:
        """``file:line:column`` of a key path, or just the file name when unknown."""
        pos = self.positions.get(path)
        return f"{self.file}:{pos[0]}:{pos[1]}" if pos else self.file

    def entry_ref(self, name: str, index: int) -> str:
        path = f"vgpu-configs.{name}[{index}]"
        return f"{self.location(path)} ({path})"
