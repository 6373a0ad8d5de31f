"""``vgpu-state validate``, ``schema`` and ``select``: the config file from the shell."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import NoReturn

import click

from vgpu_state.catalog import default_catalog, suggest
from vgpu_state.cli.common import parse_labels
from vgpu_state.cli.errors import error_document, report
from vgpu_state.cli.options import (
    config_file_option,
    config_name_option,
    default_config_option,
    label_key_option,
    node_option,
    output_option,
    sim_option,
)
from vgpu_state.config import (
    ConfigDocument,
    json_schema_text,
    load_file,
    load_text,
    resolve,
    select,
)
from vgpu_state.model.desired import DesiredState
from vgpu_state.model.errors import ConfigError, ConfigIssue, SelectionError, VgpuStateError
from vgpu_state.model.ids import NVIDIA_VENDOR_ID
from vgpu_state.model.pci import parse_pci_address
from vgpu_state.model.policy import Publish
from vgpu_state.model.snapshot import Gpu


def _fail(
    lines: Sequence[str], reason: str = "Failed", issues: Sequence[ConfigIssue] = ()
) -> NoReturn:
    """The error lines on stderr (with ``-o json``: the error document on stdout); exit 1."""
    message = lines[0] if lines else "failed"
    if message.startswith("error: "):
        message = message[len("error: ") :]
    report(reason, "user", message, issues=issues, text=lines)


def load_document(path: str, strict: bool = False, *, as_json: bool = False) -> ConfigDocument:
    """Load ``path`` (``-`` = stdin); print every error and exit 1 when it is invalid.

    Warnings are printed to stderr; ``strict`` makes them errors. ``as_json``: an
    invalid file is also reported as ``validate -o json``'s object on stdout.
    """
    catalog = default_catalog()
    try:
        if path == "-":
            document = load_text(sys.stdin.read(), "<stdin>", catalog=catalog, strict=strict)
        else:
            document = load_file(path, catalog=catalog, strict=strict)
    except ConfigError as exc:
        lines = [str(issue) for issue in exc.issues] or [str(exc)]
        if as_json:
            _json_result(path, None, False, lines, error=(exc.reason.value, exc.issues))
            _fail_text(lines)
        _fail(lines, exc.reason.value, exc.issues)
    except VgpuStateError as exc:
        if as_json:
            _json_result(path, None, False, [str(exc)], error=(exc.reason.value, ()))
            _fail_text([f"error: {exc}"])
        _fail([f"error: {exc}"], exc.reason.value)
    print_warnings(document)
    return document


def _fail_text(lines: Sequence[str]) -> NoReturn:
    """The error lines on stderr (the JSON document is printed already); exit 1."""
    for line in lines:
        click.echo(line, err=True)
    sys.exit(1)


def print_warnings(document: ConfigDocument) -> None:
    """The document's warnings, then its notes (what rests on an inferred rule), on stderr."""
    for line in _warning_lines(document) + _note_lines(document):
        click.echo(line, err=True)


def gpus_from_flags(specs: Sequence[str]) -> tuple[Gpu, ...]:
    """GPUs from ``ADDRESS=MODEL`` flags; the index is the order by address."""
    catalog = default_catalog()
    parsed: list[tuple[str, str]] = []
    for spec in specs:
        address, sep, model_text = spec.partition("=")
        if not sep or not model_text.strip():
            raise click.BadParameter(
                f"{spec!r}: expected ADDRESS=MODEL, e.g. 0000:08:00.0=A2", param_hint="--gpu"
            )
        try:
            canonical = parse_pci_address(address)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--gpu") from None
        if any(a == canonical for a, _ in parsed):
            raise click.BadParameter(
                f"{spec!r}: GPU {canonical} is given twice", param_hint="--gpu"
            )
        parsed.append((canonical, model_text.strip()))
    gpus = []
    for index, (address, model_text) in enumerate(sorted(parsed)):
        model = catalog.find_model(model_text)
        if model is None:
            names = [m.short_name for m in catalog.models]
            hint = suggest(model_text, names)
            tail = f"; did you mean {hint}?" if hint else ""
            raise click.BadParameter(f"unknown GPU model {model_text!r}{tail}", param_hint="--gpu")
        gpus.append(
            Gpu(
                index=index,
                address=address,
                vendor_id=NVIDIA_VENDOR_ID,
                device_id=model.device_ids[0],
                subsystem_vendor_id=NVIDIA_VENDOR_ID,
                subsystem_device_id=(model.subsystem_device_ids or (0,))[0],
                model=model.name,
                sriov_totalvfs=model.sriov_totalvfs,
            )
        )
    return tuple(gpus)


def gpus_from_sim(spec: str) -> tuple[tuple[Gpu, ...], str, dict[str, str]]:
    """GPUs, node name and labels of a simulated node (its sysfs scanned in memory)."""
    from vgpu_state.cli.session import warn
    from vgpu_state.compose import NodeSettings, open_node

    try:
        node = open_node(NodeSettings(default_catalog(), sim_spec=spec), warn)
        try:
            return node.host.scan().gpus, node.cluster.node_name(), dict(node.cluster.labels())
        finally:
            node.close()
    except VgpuStateError as exc:
        _fail([f"error: {exc}"], exc.reason.value)
        raise


def render_layout(state: DesiredState, gpus: Sequence[Gpu]) -> list[str]:
    """One line per GPU: its layout, or ``unmanaged``."""
    catalog = default_catalog()
    wanted = {g.address: g for g in state.gpus}
    lines = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        model = catalog.model(gpu.model) if gpu.model else None
        label = model.short_name if model is not None else (gpu.model or "unknown model")
        head = f"  GPU {gpu.index} {gpu.address} {label}:"
        desired = wanted.get(gpu.address)
        if desired is None:
            lines.append(f"{head} unmanaged (no entry covers it; left untouched)")
            continue
        layout = ", ".join(f"{count}x {name}" for name, count in desired.types) or "no vGPUs"
        channel = "  (published through DRA)" if desired.publish is Publish.DRA else ""
        lines.append(f"{head} {layout}{channel}  [{desired.entry}]")
    return lines


@click.command("validate")
@config_file_option(required=True)
@config_name_option("validate: also check that it exists.")
@click.option(
    "--strict",
    is_flag=True,
    help="Treat warnings (vGPU types the catalog does not know) as errors; notes stay notes.",
)
@output_option()
def validate(config_file: str, config_name: str | None, strict: bool, output: str) -> None:
    """Check a config file; print every error as file:line:column: message.

    A type name the catalog does not know is a warning (exit 0): the node's driver
    decides whether it offers it. --strict makes warnings errors (exit 1). A layout
    that rests on an inferred rule (MIG GPU instances, mixed-size placement) gets a
    note, "experimental: inferred, not verified on hardware", which --strict leaves
    a note.
    With -o json the result is one JSON object on stdout (errors too).

    \b
    Examples:
      vgpu-state validate -f configs/default.yaml
      vgpu-state validate -f configs/examples/node-pools.yaml -c compute --strict
      kubectl -n vgpu-state get configmap vgpu-state-config \\
        -o jsonpath='{.data.config\\.yaml}' | vgpu-state validate -f -
      vgpu-state validate -f configs/default.yaml -o json
    """
    as_json = output == "json"
    document = load_document(config_file, strict, as_json=as_json)
    if config_name is not None and config_name not in document.configs:
        hint = suggest(config_name, document.config_names)
        tail = f"; did you mean {hint}?" if hint else ""
        message = f"{document.file}: config {config_name!r} is not defined{tail}"
        if as_json:
            _json_result(document.file, document, False, [message], error=("SelectionInvalid", ()))
            _fail_text([message])
        _fail([message], "SelectionInvalid")
    if as_json:
        _json_result(document.file, document, True, [])
        return
    count = len(document.configs)
    said = [
        f"{n} {what}{'s' if n != 1 else ''}"
        for n, what in ((len(document.warnings), "warning"), (len(document.notes), "note"))
        if n
    ]
    tail = f" ({', '.join(said)})" if said else ""
    click.echo(f"{document.file}: valid: {count} config{'s' if count != 1 else ''}{tail}")
    for line in publish_lines(document):
        click.echo(line)


def _warning_lines(document: ConfigDocument) -> list[str]:
    return [
        f"{i.file}:{i.line}:{i.column}: warning: {i.message}{f' ({i.path})' if i.path else ''}"
        for i in document.warnings
    ]


def _note_lines(document: ConfigDocument) -> list[str]:
    return [
        f"{i.file}:{i.line}:{i.column}: note: {i.message}{f' ({i.path})' if i.path else ''}"
        for i in document.notes
    ]


def _json_result(
    file: str,
    document: ConfigDocument | None,
    valid: bool,
    errors: Sequence[str],
    error: tuple[str, Sequence[ConfigIssue]] | None = None,
) -> None:
    """``validate -o json``: ``{"file", "valid", "configs", "errors", "warnings", "notes"}``; an
    invalid file also has the one error document's ``error`` (reason, issues)."""
    result: dict[str, object] = {}
    if error is not None:
        result.update(error_document(error[0], "user", errors[0], error[1]))
    result |= {
        "file": file,
        "valid": valid,
        "configs": list(document.config_names) if document is not None else [],
        "errors": list(errors),
        "warnings": _warning_lines(document) if document is not None else [],
        "notes": _note_lines(document) if document is not None else [],
    }
    click.echo(json.dumps(result, indent=2))


def publish_lines(document: ConfigDocument) -> list[str]:
    """For each config that publishes any vGPUs through DRA: which entries do."""
    lines = []
    for name, config in document.configs.items():
        default = document.policy_for(name).publish
        dra = [i for i, e in enumerate(config.entries) if (e.publish or default) is Publish.DRA]
        if not dra:
            continue
        if len(dra) == len(config.entries):
            which = "every entry"
        else:
            which = "entries " + ", ".join(f"[{i}]" for i in dra)
        lines.append(
            f"  {name}: {which} published through DRA (ResourceSlices), not the device plugin"
        )
    return lines


@click.command("schema")
def schema() -> None:
    """Print the JSON Schema of the config file (for editors and CI linters).

    \b
    Examples:
      vgpu-state schema > vgpu-state-config.schema.json
      # In a layouts file, for editors with the YAML language server:
      # yaml-language-server: $schema=./vgpu-state-config.schema.json
    """
    click.echo(json_schema_text(), nl=False)


@click.command("select")
@config_file_option(required=True)
@node_option()
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="A node label.")
@click.option(
    "--gpu", "gpu_specs", multiple=True, metavar="ADDRESS=MODEL", help="A GPU, e.g. 08:00.0=A2."
)
@sim_option("Take the node name, labels and GPUs from a simulated node spec.")
@label_key_option()
@default_config_option()
@output_option()
def select_cmd(
    config_file: str,
    node: str | None,
    labels: tuple[str, ...],
    gpu_specs: tuple[str, ...],
    sim_spec: str | None,
    label_key: str,
    default_config: str | None,
    output: str,
) -> None:
    """Show which config a node gets, by which rule, and the layout of each GPU.

    Exit 0 when a config is selected, 1 when none is (the node would be left
    alone: no label, no matching node-selector, no default and no
    --default-config) or on an error.

    \b
    Examples:
      vgpu-state select -f configs/examples/node-pools.yaml --node n1 --label pool=vdi \\
          --gpu 08:00.0=A2 --gpu 3b:00.0=A16
      vgpu-state select -f configs/examples/mixed-node.yaml --sim configs/sim/mixed.yaml
      vgpu-state select -f configs/default.yaml --sim configs/sim/t4-pair.yaml -o json
    """
    node_name = node
    document = load_document(config_file, as_json=False)
    node_labels: dict[str, str] = {}
    if sim_spec:
        if gpu_specs:
            _fail(["error: give either --sim or --gpu, not both"], "UsageError")
        gpus, sim_node, node_labels = gpus_from_sim(sim_spec)
        node_name = node_name or sim_node
    else:
        gpus = gpus_from_flags(gpu_specs)
    if not node_name:
        _fail(["error: missing --node NAME (or --sim SPEC)"], "UsageError")
        return
    node_labels.update(parse_labels(labels))
    try:
        selection = select(document, node_name, node_labels, label_key, default_config or None)
    except SelectionError as exc:
        _fail([f"error: {exc}"], exc.reason.value)
    result: dict[str, object] = {
        "node": node_name,
        "config": selection.config,
        "source": selection.detail,
        "rule": selection.source,
        "policy": None,
        "gpus": [],
    }
    if selection.config is None:
        message = (
            f"node {node_name}: no config selected: {selection.detail}; every GPU is "
            "left unmanaged (label the node, add a node-selector or a default, or give "
            "--default-config)"
        )
        if output == "json":
            doc = error_document("NoConfigSelected", "user", message)
            doc |= result
            doc["gpus"] = [
                {"index": g.index, "address": g.address, "model": g.model, "managed": False}
                for g in gpus
            ]
            click.echo(json.dumps(doc, indent=2))
        else:
            for gpu in gpus:
                click.echo(f"  GPU {gpu.index} {gpu.address}: unmanaged")
        click.echo(f"error: {message}", err=True)
        sys.exit(1)
    try:
        state = resolve(
            document, selection.config, gpus, node_name, selection.source, default_catalog()
        )
    except ConfigError as exc:
        _fail([str(issue) for issue in exc.issues], exc.reason.value, exc.issues)
    p = state.policy
    if output == "json":
        wanted = {g.address: g for g in state.gpus}
        result["policy"] = {
            "in_use": str(p.in_use), "prune": p.prune, "sriov": str(p.sriov),
            "publish": str(p.publish),
        }  # fmt: skip
        result["gpus"] = [
            {
                "index": g.index,
                "address": g.address,
                "model": g.model,
                "managed": g.address in wanted,
                "layout": dict(wanted[g.address].types) if g.address in wanted else None,
                "publish": str(wanted[g.address].publish) if g.address in wanted else None,
                "entry": wanted[g.address].entry if g.address in wanted else None,
            }
            for g in sorted(gpus, key=lambda g: g.index)
        ]
        result["skipped"] = [e.model_dump(mode="json") for e in state.skipped]
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(f"node {node_name}: config {selection.config} from {selection.detail}")
    click.echo(
        f"  policy: in-use={p.in_use} prune={str(p.prune).lower()} sriov={p.sriov} "
        f"publish={p.publish}"
    )
    for line in render_layout(state, gpus):
        click.echo(line)
    for skipped in state.skipped:
        click.echo(f"  {skipped.message}")
