"""Entry point of the ``vgpu-state`` command."""

from __future__ import annotations

import importlib
import sys

import click

from vgpu_state import __version__

# name -> (module, attribute, one-line help). Modules load only when the command runs.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "validate": ("vgpu_state.cli.validate", "validate", "Check a config file; print every error."),
    "schema": ("vgpu_state.cli.validate", "schema", "Print the JSON Schema of the config file."),
    "select": (
        "vgpu_state.cli.validate",
        "select_cmd",
        "Show which config a node gets and the layout of each GPU.",
    ),
    "scan": ("vgpu_state.cli.scan", "scan", "Show the node's GPUs, vGPUs and creatable types."),
    "sim": ("vgpu_state.cli.sim", "sim", "Run the NVIDIA vGPU driver simulator (FUSE mount)."),
    "plan": ("vgpu_state.cli.plan", "plan_cmd", "Show the changes apply would make (dry run)."),
    "apply": ("vgpu_state.cli.plan", "apply_cmd", "Plan, confirm, apply; or apply a saved plan."),
    "assert": (
        "vgpu_state.cli.plan",
        "assert_cmd",
        "Exit 0 when the node matches its config, 1 otherwise.",
    ),
    "export": ("vgpu_state.cli.plan", "export_cmd", "Print a config that reproduces the node."),
    "history": ("vgpu_state.cli.plan", "history_cmd", "Show the journal of past applies."),
    "agent": ("vgpu_state.cli.agent", "agent", "Run the per-node agent: watch, reconcile, report."),
    "deviceplugin": (
        "vgpu_state.cli.deviceplugin",
        "deviceplugin",
        "Serve the kubelet device plugin for the node's vGPUs (foreground).",
    ),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = COMMANDS.get(cmd_name)
        if spec is None:
            return None
        module = importlib.import_module(spec[0])
        command = getattr(module, spec[1])
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vgpu-state")
def cli() -> None:
    """Declarative desired state for NVIDIA vGPU on Kubernetes and KubeVirt nodes.

    Write the vGPU layouts in a config file, see the plan, apply it.
    Exit codes: 0 success, 1 error; commands with --detailed-exitcode use 2 for
    "changes needed".
    """


def main() -> None:
    try:
        cli.main(prog_name="vgpu-state")
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
