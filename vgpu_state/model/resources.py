"""Kubernetes resource names for vGPU types: one rule shared by the KubeVirt CR and the plugin.

A vGPU type is advertised to the kubelet, and permitted in the KubeVirt CR, as
the extended resource ``nvidia.com/<type name with each run of whitespace as _>``
(``NVIDIA A2-4Q`` -> ``nvidia.com/NVIDIA_A2-4Q``), the name NVIDIA's and
KubeVirt's own plugins use, so VM specs written for them keep working. The name
is checked against the kubelet's extended-resource-name rules and never
silently rewritten: a type whose name cannot be a resource is reported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from vgpu_state.model.snapshot import Gpu, NodeSnapshot, SharedParts, Vgpu

DEFAULT_DOMAIN = "nvidia.com"

_WHITESPACE = re.compile(r"\s+")
# The part after the slash: a qualified-name segment, at most 63 characters.
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# The prefix: a lower-case DNS subdomain.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class ResourceNameError(ValueError):
    """A vGPU type name that cannot be a Kubernetes extended resource name."""


def resource_name(type_name: str, domain: str = DEFAULT_DOMAIN) -> str:
    """The extended resource name for a vGPU type name, or :class:`ResourceNameError`."""
    name = f"{domain}/{_WHITESPACE.sub('_', type_name.strip())}"
    problem = resource_name_problem(name)
    if problem:
        raise ResourceNameError(f"vGPU type {type_name!r} gives resource {name!r}: {problem}")
    return name


def resource_name_problem(name: str) -> str | None:
    """Why ``name`` is not a legal extended resource name, or ``None`` when it is.

    The kubelet's rules: ``<prefix>/<name>``; the prefix a lower-case DNS
    subdomain outside ``kubernetes.io``; the name at most 63 characters of
    ``[A-Za-z0-9._-]`` that starts and ends alphanumeric; no ``requests.`` prefix.
    """
    if name.count("/") != 1:
        return "it must be <domain>/<name> with exactly one '/'"
    prefix, local = name.split("/")
    if name.startswith("requests."):
        return "it must not start with 'requests.'"
    if not prefix or len(prefix) > 253 or not all(_DNS_LABEL.match(p) for p in prefix.split(".")):
        return f"the domain {prefix!r} is not a lower-case DNS subdomain"
    if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io"):
        return "the kubernetes.io domain is reserved"
    if not local:
        return "the name after '/' is empty"
    if len(local) > 63:
        return f"the name after '/' has {len(local)} characters (at most 63)"
    if not _NAME.match(local):
        return (
            "the name after '/' may hold only letters, digits, '-', '_' and '.', "
            "and must start and end with a letter or digit"
        )
    return None


def env_var(resource: str, kind: Literal["mdev", "vf"]) -> str:
    """The variable KubeVirt's virt-launcher reads for a resource's allocated devices.

    ``MDEV_PCI_RESOURCE_<R>`` (mdev UUIDs) or ``PCI_RESOURCE_<R>`` (VF addresses),
    where ``<R>`` is the resource upper-cased with ``/`` and ``.`` as ``_``.
    """
    prefix = "MDEV_PCI_RESOURCE" if kind == "mdev" else "PCI_RESOURCE"
    return f"{prefix}_{resource.upper().replace('/', '_').replace('.', '_')}"


def name_prefix(gpu: Gpu) -> str | None:
    """The product prefix the driver puts before a type on this GPU (``NVIDIA``, ``GRID``).

    Read off any type whose full and short names the GPU shows; the driver names
    every type of a GPU the same way.
    """
    found = SharedParts.get((gpu.vfs, gpu.pf_creatable), ("prefix",), lambda: _listed_prefix(gpu))
    if found is not _NONE_LISTED:
        return found
    return _prefix(((v.type_sysfs_name, v.type_name) for v in gpu.vgpus), None)


_NONE_LISTED = "\0"
"""What :func:`_listed_prefix` gives when no type of the GPU's lists names one."""


def _listed_prefix(gpu: Gpu) -> str | None:
    """:func:`name_prefix` from the GPU's type lists alone (the same for every GPU with
    those lists: see ``SharedParts``); :data:`_NONE_LISTED` when none tells."""
    named = [(t.sysfs_name, t.name) for vf in gpu.vfs for t in vf.creatable]
    named += [(t.sysfs_name, t.name) for t in gpu.pf_creatable]
    return _prefix(named, _NONE_LISTED)


def _prefix(named: Iterable[tuple[str | None, str | None]], otherwise: str | None) -> str | None:
    for full, short in named:
        if full and short and full.endswith(short) and full != short:
            return full[: -len(short)].strip() or None
    return otherwise


def sysfs_names(snapshot: NodeSnapshot) -> dict[int, str]:
    """The driver's (sysfs) name of every type id the node shows."""
    return gpus_sysfs_names(snapshot.gpus)


def gpus_sysfs_names(gpus: Iterable[Gpu]) -> dict[int, str]:
    """The driver's (sysfs) name of every type id these GPUs show."""
    names: dict[int, str] = {}
    for gpu in gpus:
        for type_id, name in _listed_names(gpu).items():
            names.setdefault(type_id, name)
        for v in gpu.vgpus:
            if v.type_sysfs_name and v.type_id is not None:
                names.setdefault(v.type_id, v.type_sysfs_name)
    return names


def driver_type_name(v: Vgpu, known: dict[int, str], prefix: str | None) -> str | None:
    """The driver's name of a vGPU's type: its own, the node's for its type id, else
    the GPU's product prefix before the short name; ``None`` when none is known (a
    vGPU a plan will create on a GPU whose virtual functions are still off)."""
    name = v.type_sysfs_name or (known.get(v.type_id) if v.type_id is not None else None)
    if not name and prefix and v.type_name:
        name = f"{prefix} {v.type_name}"
    return name or None


def _listed_names(gpu: Gpu) -> dict[int, str]:
    """The driver's name of each type id the GPU's lists show, the first one listed (the
    same for every GPU with those lists: see ``SharedParts``)."""

    def compute() -> dict[int, str]:
        names: dict[int, str] = {}
        for t in (*gpu.pf_creatable, *(t for vf in gpu.vfs for t in vf.creatable)):
            if t.sysfs_name:
                names.setdefault(t.type_id, t.sysfs_name)
        return names

    return SharedParts.get((gpu.vfs, gpu.pf_creatable), ("names",), compute)
