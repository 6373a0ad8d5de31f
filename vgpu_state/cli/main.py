"""Entry point of the ``vgpu-state`` command."""

from __future__ import annotations

import gc
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import click

from vgpu_state.cli.options import (
    ENV_LOG_LEVEL,
    LOG_LEVELS,
    SuggestingGroup,
    json_requested,
    modernise,
)

# name -> (module, attribute, one-line help). Modules load only when the command runs.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "validate": ("vgpu_state.cli.validate", "validate", "Check a config file; print every error."),
    "schema": ("vgpu_state.cli.validate", "schema", "Print the JSON Schema of the config file."),
    "select": (
        "vgpu_state.cli.validate",
        "select_cmd",
        "Show which config a node gets and the layout of each GPU.",
    ),
    "doctor": (
        "vgpu_state.cli.doctor",
        "doctor_cmd",
        "Check whether the host can run vGPUs; say why not, GPU by GPU.",
    ),
    "scan": ("vgpu_state.cli.scan", "scan", "Show the node's GPUs, vGPUs and creatable types."),
    "sim": ("vgpu_state.cli.sim", "sim", "Run the NVIDIA vGPU driver simulator (FUSE mount)."),
    "plan": ("vgpu_state.cli.plan", "plan_cmd", "Show the changes apply would make (dry run)."),
    "apply": ("vgpu_state.cli.apply", "apply_cmd", "Plan, confirm, apply; or apply a saved plan."),
    "assert": (
        "vgpu_state.cli.assert_",
        "assert_cmd",
        "Exit 0 when the node matches its config, 1 otherwise.",
    ),
    "export": ("vgpu_state.cli.export", "export_cmd", "Print a config that reproduces the node."),
    "history": ("vgpu_state.cli.history", "history_cmd", "Show the journal of past applies."),
    "fleet": (
        "vgpu_state.cli.fleet",
        "fleet",
        "Cluster-wide: fleet plan shows every node's plan for a config (dry run).",
    ),
    "agent": ("vgpu_state.cli.agent", "agent", "Run the per-node agent: watch, reconcile, report."),
    "dra-remove-slices": (
        "vgpu_state.cli.dra",
        "dra_remove_slices",
        "Delete the DRA driver's ResourceSlices (uninstall); check none is left.",
    ),
    "controller": (
        "vgpu_state.cli.controller",
        "controller",
        "Run the cluster controller: the KubeVirt CR from every node's VGPUNodeState.",
    ),
    "deviceplugin": (
        "vgpu_state.cli.deviceplugin",
        "deviceplugin",
        "Serve the kubelet device plugin for the node's vGPUs (foreground).",
    ),
}


_start_up = {"collector_paused": False}


def _start_up_done() -> None:
    """The command's module is loaded: resume the cyclic garbage collector that
    :func:`main` paused, with what exists now (modules, classes, schemas: kept for the
    whole run) moved out of its reach, so that its later passes need not walk them."""
    if _start_up["collector_paused"]:
        _start_up["collector_paused"] = False
        gc.freeze()
        gc.enable()


class LazyGroup(SuggestingGroup):
    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """The command, and its arguments with old option spellings rewritten (with a
        deprecation warning; :func:`vgpu_state.cli.options.modernise`)."""
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None:
            named = any(p.name == "config_name" for p in command.params)
            rest = modernise(rest, has_config_name=named)
        return name, command, rest

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = COMMANDS.get(cmd_name)
        if spec is None:
            return None
        module = importlib.import_module(spec[0])
        _start_up_done()
        command = getattr(module, spec[1])
        assert isinstance(command, click.Command)
        return command

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Run a command; exit 0 or the command's code, 1 on any error, 130 on Ctrl-C.

        Usage errors exit 1 with click's message (click itself uses 2), so that
        2 under ``--detailed-exitcode`` only ever means "changes"; with ``-o json``
        on the command line they also print the one error document on stdout
        (:mod:`vgpu_state.cli.errors`). No error prints a traceback
        (``VGPU_STATE_DEBUG=1`` shows one for an unexpected error).
        """
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        given = list(args) if args is not None else sys.argv[1:]
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.ClickException as e:
            if json_requested(given):
                from vgpu_state.cli.errors import print_error_document

                print_error_document("UsageError", "usage", e.format_message())
            e.show()
            sys.exit(1)
        except (KeyboardInterrupt, click.exceptions.Abort):
            click.echo("\ninterrupted", err=True)
            sys.exit(130)
        except BrokenPipeError:
            sys.stderr.close()
            sys.exit(1)
        except Exception as e:
            if os.environ.get("VGPU_STATE_DEBUG") == "1":
                raise
            message = (
                f"unexpected {type(e).__name__}: {e} (this is a bug in vgpu-state; "
                "VGPU_STATE_DEBUG=1 shows the traceback)"
            )
            if json_requested(given):
                from vgpu_state.cli.errors import print_error_document

                print_error_document("Internal", "internal", message)
            click.echo(f"error: {message}", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version``, as ``click.version_option`` prints it; the package's metadata is read
    only then."""
    if not value or ctx.resilient_parsing:
        return
    from vgpu_state import __version__

    click.echo(f"vgpu-state, version {__version__}", color=ctx.color)
    ctx.exit()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and exit.",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS),
    envvar=ENV_LOG_LEVEL,
    help=f"Log messages from this level up, for every command (agent, controller: "
    f"default info; others: warning). Env: {ENV_LOG_LEVEL}.",
)
@click.option(
    "--no-color",
    is_flag=True,
    help="No colours in any output (as the NO_COLOR environment variable does).",
)
def cli(log_level: str | None, no_color: bool) -> None:
    """Declarative desired state for NVIDIA vGPU on Kubernetes and KubeVirt nodes.

    Write the vGPU layouts in a config file, see the plan, apply it.
    Exit codes: 0 success, 1 error (usage errors too), 130 interrupted (Ctrl-C);
    plan --detailed-exitcode uses 2 for "changes needed".

    The options above apply to every command and come before it. Shell
    completion: docs/cli.md.

    \b
    Examples:
      vgpu-state scan --sim configs/sim/mixed.yaml
      vgpu-state --no-color plan -f configs/examples/mixed-node.yaml --sim node.yaml
      vgpu-state --log-level debug doctor --sim configs/sim/a2-host.yaml
      vgpu-state COMMAND --help
    """
    if no_color:
        os.environ["NO_COLOR"] = "1"
    if log_level:
        # Commands with their own --log-level (agent, controller) read it from here.
        os.environ[ENV_LOG_LEVEL] = log_level
        logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")


def main() -> None:
    # Loading a command's modules makes tens of thousands of objects that live as long as
    # the process, and next to no garbage: the collector's passes over them while they
    # are made were a tenth of the start-up. Resumed once the command's module is loaded.
    if gc.isenabled():
        gc.disable()
        _start_up["collector_paused"] = True
    cli.main(prog_name="vgpu-state")


if __name__ == "__main__":
    main()
