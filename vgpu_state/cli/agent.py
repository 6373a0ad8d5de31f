"""``vgpu-state agent``: the per-node daemon (see docs/agent.md)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from vgpu_state import wellknown
from vgpu_state.cli.common import handle_errors
from vgpu_state.cli.options import (
    STRICT_ENTRIES_HELP,
    config_file_option,
    daemon_options,
    default_config_option,
    device_plugin_dir_option,
    directory_option,
    listen_option,
    log_level_option,
    node_option,
    proc_root_option,
    seconds_option,
    sim_option,
    state_dir_option,
    strict_option,
    sysfs_root_option,
)


@click.command("agent")
@node_option("This node's name ($NODE_NAME).", required=True, envvar="NODE_NAME")
@config_file_option(
    stdin=False,
    required=True,
    note="agent: the mounted ConfigMap's file (/etc/vgpu-state/config.yaml in the shipped "
    "DaemonSet); the agent watches its directory.",
)
@default_config_option()
@strict_option(STRICT_ENTRIES_HELP)
@click.option(
    "--mode",
    type=click.Choice(["enforce", "plan-only"]),
    default="plan-only",
    show_default=True,
    help="plan-only: report what would change, change nothing (as deploy/ and the Helm "
    "chart install it); enforce: apply (blocked items are skipped and reported). "
    "The node label vgpu-state.io/mode (enforce or plan-only) overrides it per node.",
)
@click.option(
    "--resync",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds between periodic reconciles (sysfs changes are not watched).",
)
@seconds_option(
    "--holder-poll",
    5.0,
    "While a layout switch waits for a holder: seconds between reads of the holders "
    "(a change reconciles at once).",
    min_open=True,
)
@listen_option("HOST:PORT of /healthz, /readyz and /metrics ('' to serve none).")
@daemon_options("Namespace of the rollout-slot Leases ($POD_NAMESPACE).")
@sysfs_root_option("Where sysfs is mounted (--sim: a simulated node instead).")
@sim_option("Drive a simulated node (spec file) instead of sysfs; the spec is saved after applies.")
@state_dir_option()
@proc_root_option(
    "The host's /proc: processes holding a vGPU's VFIO device open (a VM's QEMU) block "
    "it (default /proc; the DaemonSet mounts the host's at /host/proc; with --sim: the "
    "simulated node's)."
)
@click.option(
    "--sriov-manage",
    envvar="VGPU_STATE_SRIOV_MANAGE",
    default=None,
    help="The sriov-manage command that turns SR-IOV on (default "
    "/usr/lib/nvidia/sriov-manage when installed; '' writes sriov_numvfs). "
    "Env: VGPU_STATE_SRIOV_MANAGE.",
)
@click.option(
    "--nvidia-smi",
    envvar="VGPU_STATE_NVIDIA_SMI",
    default=None,
    help="The nvidia-smi command that reads and changes MIG and mixed-size mode (default "
    "/usr/bin/nvidia-smi when installed; '' for none). Env: VGPU_STATE_NVIDIA_SMI.",
)
@click.option(
    "--pod-resources",
    default=wellknown.KUBELET_POD_RESOURCES_SOCKET,
    show_default=True,
    help="The kubelet's pod-resources socket: which pods hold which vGPUs.",
)
@click.option(
    "--in-use-file",
    default=None,
    help="Held vGPUs instead of the kubelet's (JSON object KEY: HOLDER, or lines KEY HOLDER), "
    "re-read every reconcile.",
)
@click.option(
    "--kubevirt",
    default=None,
    help="NAMESPACE/NAME of the KubeVirt CR whose blockers the agent honours (default: the "
    "only one; the agent reads it, the controller writes it).",
)
@click.option(
    "--no-kubevirt",
    is_flag=True,
    help="Do not read the KubeVirt CR (a cluster without KubeVirt): its blockers go unchecked.",
)
@device_plugin_dir_option(": the agent registers one device plugin per vGPU type")
@click.option(
    "--no-device-plugin",
    is_flag=True,
    help="Serve no device plugin (another component advertises the vGPUs to the kubelet).",
)
@click.option(
    "--gpu-operator",
    is_flag=True,
    help="Run inside NVIDIA's GPU Operator in place of its vgpu-device-manager: serve no "
    "device plugin (the operator's sandbox device plugin advertises the vGPUs) and pause "
    "the operator's sandbox device plugin and validator on this node around every change "
    "(docs/deploy.md).",
)
@click.option(
    "--gpu-operator-namespace",
    default="gpu-operator",
    show_default=True,
    envvar="GPU_OPERATOR_NAMESPACE",
    help="--gpu-operator: the namespace of the GPU Operator's pods. Env: GPU_OPERATOR_NAMESPACE.",
)
@seconds_option(
    "--allocatable-grace",
    40.0,
    "How long the kubelet may take to offer a changed device list before the "
    "KubeletAllocatable condition turns False and a lost resource is registered again "
    "(the kubelet posts its node status about every 10 s).",
    min_open=True,
    metavar="SECONDS",
)
@click.option(
    "--dra",
    is_flag=True,
    help="Serve the kubelet DRA plugin and publish ResourceSlices for the vGPUs of GPUs whose "
    "policy says publish: dra (docs/dra.md).",
)
@directory_option(
    "--dra-plugins-dir",
    wellknown.KUBELET_PLUGINS_DIR,
    "The kubelet's plugins directory (the DRA socket goes in <dir>/vgpu.vgpu-state.io).",
)
@directory_option(
    "--dra-registry-dir",
    wellknown.KUBELET_PLUGIN_REGISTRY_DIR,
    "The kubelet's plugin registration directory.",
)
@directory_option("--cdi-dir", wellknown.CDI_DIR, "Where prepared claims' CDI specs are written.")
@log_level_option()
@handle_errors
def agent(
    node: str,
    config_file: str,
    default_config: str | None,
    strict: bool,
    mode: str,
    resync: float,
    holder_poll: float,
    listen: str,
    kubeconfig: str | None,
    context: str | None,
    namespace: str,
    sysfs_root: str | None,
    sim_spec: str | None,
    state_dir: str | None,
    proc_root: str | None,
    sriov_manage: str | None,
    nvidia_smi: str | None,
    pod_resources: str,
    in_use_file: str | None,
    kubevirt: str | None,
    no_kubevirt: bool,
    device_plugin_dir: str,
    no_device_plugin: bool,
    gpu_operator: bool,
    gpu_operator_namespace: str,
    allocatable_grace: float,
    dra: bool,
    dra_plugins_dir: Path,
    dra_registry_dir: Path,
    cdi_dir: Path,
    log_level: str,
) -> None:
    """Keep this node equal to its layout: watch, reconcile, report; SIGTERM stops it (exit 0).

    Runs in the DaemonSet of deploy/ (docs/agent.md); by hand, on a simulated node:

    \b
    Examples:
      vgpu-state agent --node "$NODE_NAME" -f /etc/vgpu-state/config.yaml --mode plan-only
      vgpu-state agent --node gpu-node-1 --sim node.yaml -f ./layouts/config.yaml \\
          --kubeconfig ~/.kube/config --no-device-plugin
    """
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from vgpu_state.agent.assemble import AgentFlags, build
    from vgpu_state.cli.session import nvidia_smi_command, sriov_manage_command

    flags = AgentFlags(
        node=node,
        config_file=Path(config_file),
        default_config=default_config or None,
        strict=strict,
        mode=mode,
        resync=resync,
        holder_poll=holder_poll,
        listen=listen,
        kubeconfig=kubeconfig,
        context=context,
        namespace=namespace,
        sysfs_root=sysfs_root or wellknown.SYSFS_ROOT,
        sim_spec=sim_spec,
        state_dir=Path(state_dir) if state_dir else None,
        proc_root=proc_root,
        sriov_manage=sriov_manage_command(sriov_manage),
        nvidia_smi=nvidia_smi_command(nvidia_smi),
        in_use_file=in_use_file,
        pod_resources=pod_resources,
        kubevirt=kubevirt,
        manage_kubevirt=not no_kubevirt,
        device_plugin=not no_device_plugin,
        device_plugin_dir=device_plugin_dir,
        allocatable_grace=allocatable_grace,
        gpu_operator=gpu_operator,
        gpu_operator_namespace=gpu_operator_namespace,
        dra=dra,
        dra_plugins_dir=dra_plugins_dir,
        dra_registry_dir=dra_registry_dir,
        cdi_dir=cdi_dir,
    )
    agent_ = build(flags)
    sys.exit(agent_.run())
