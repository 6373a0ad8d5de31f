"""``vgpu-state controller``: the cluster controller (see docs/cluster.md)."""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

import click

from vgpu_state.cli.common import handle_errors
from vgpu_state.cli.options import (
    config_file_option,
    daemon_options,
    listen_option,
    log_level_option,
    seconds_option,
)

F = TypeVar("F", bound=Callable[..., Any])

WEBHOOK_OBJECTS = (
    (
        "--webhook-service",
        "vgpu-state-controller",
        "The Service the API server calls the webhook through (the certificate names it).",
    ),
    (
        "--webhook-secret",
        "vgpu-state-controller-tls",
        "Secret (in --namespace) holding the webhook's CA and serving certificate; "
        "created and renewed by the controller.",
    ),
    (
        "--webhook-configuration",
        "vgpu-state-layouts",
        "ValidatingWebhookConfiguration whose caBundle the controller keeps in step.",
    ),
)
"""The names of the webhook's objects: flag, default, help."""


def _webhook_objects(fn: F) -> F:
    for flag, default, text in reversed(WEBHOOK_OBJECTS):
        fn = click.option(flag, default=default, show_default=True, help=text)(fn)
    return fn


@click.command("controller")
@daemon_options("Namespace of the leader-election Lease ($POD_NAMESPACE).")
@click.option(
    "--identity",
    envvar="POD_NAME",
    default=None,
    help="This replica's name in the Lease ($POD_NAME; default: the host name).",
)
@click.option(
    "--kubevirt", default=None, help="NAMESPACE/NAME of the KubeVirt CR (default: the only one)."
)
@seconds_option(
    "--grace",
    300.0,
    "Seconds an entry vgpu-state added stays in the KubeVirt CR after the last node "
    "stopped reporting its resource.",
)
@seconds_option(
    "--interval", 10.0, "Seconds between passes over every node's VGPUNodeState.", minimum=0.1
)
@click.option(
    "--lease-seconds",
    type=click.IntRange(min=1),
    default=30,
    show_default=True,
    help="Leader-election Lease duration; another replica takes over after it expires.",
)
@seconds_option(
    "--renew-deadline",
    20.0,
    "Seconds after its last successful Lease renewal the leader steps down (shorter than "
    "--lease-seconds).",
    minimum=0.1,
)
@seconds_option(
    "--request-timeout",
    10.0,
    "Seconds one API request may take (shorter than --renew-deadline): no KubeVirt CR write "
    "is sent with less of the renew deadline left.",
    minimum=0.1,
)
@click.option(
    "--webhook-port",
    type=click.IntRange(min=0, max=65535),
    default=8443,
    show_default=True,
    help="Port of the layouts ConfigMap's validating webhook (HTTPS; 0: not served).",
)
@_webhook_objects
@click.option(
    "--webhook-cert-dir",
    type=click.Path(file_okay=False, exists=True),
    default=None,
    help="Serve tls.crt/tls.key from this directory (e.g. a cert-manager Secret) instead: "
    "the controller then writes no Secret and no caBundle.",
)
@listen_option("HOST:PORT of /metrics, /healthz and /readyz (empty: not served).")
@config_file_option(
    stdin=False,
    note="controller: the agents' layouts (their ConfigMap, mounted; the shipped Deployment "
    "passes /etc/vgpu-state/config.yaml): they bound what the KubeVirt CR may permit, and "
    "the fleet view plans with them; none: no fleet view, and no KubeVirt CR entry is "
    "added or removed.",
)
@seconds_option(
    "--fleet-interval",
    60.0,
    "Seconds between fleet views (the plan of every node, exported as metrics).",
    minimum=1,
)
@click.option(
    "--max-age",
    default="30m",
    show_default=True,
    help="In the fleet view, a node whose last scan is older is unknown (0: any age).",
)
@click.option("--once", is_flag=True, help="Take the Lease, make one pass, exit.")
@log_level_option()
@handle_errors
def controller(
    kubeconfig: str | None,
    context: str | None,
    namespace: str,
    identity: str | None,
    kubevirt: str | None,
    grace: float,
    interval: float,
    lease_seconds: int,
    renew_deadline: float,
    request_timeout: float,
    webhook_port: int,
    webhook_service: str,
    webhook_secret: str,
    webhook_configuration: str,
    webhook_cert_dir: str | None,
    listen: str,
    config_file: str | None,
    fleet_interval: float,
    max_age: str,
    once: bool,
    log_level: str,
) -> None:
    """The only writer of the KubeVirt CR's permitted devices: derives them from every
    node's VGPUNodeState (one replica acts; the others wait on the Lease).

    Runs in the Deployment of deploy/ (docs/deploy.md); by hand against a cluster:

    \b
    Examples:
      vgpu-state controller --kubeconfig ~/.kube/config --once
      vgpu-state controller --kubeconfig ~/.kube/config -f layouts.yaml
      vgpu-state controller --context prod -f layouts.yaml --once
    """
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from vgpu_state.catalog import default_catalog
    from vgpu_state.cli.fleet import parse_duration
    from vgpu_state.config import FileConfigSource
    from vgpu_state.controller.run import Controller, ControllerSettings, FleetViewSettings
    from vgpu_state.kube.api import KubeApi
    from vgpu_state.kube.kubevirt import KubeVirtRef
    from vgpu_state.model.errors import SelectionError
    from vgpu_state.reconcile.settings import Settings

    try:
        ref = KubeVirtRef.parse(kubevirt) if kubevirt else None
    except ValueError as e:
        raise SelectionError(f"--kubevirt {e}") from None
    catalog = default_catalog()
    fleet = None
    if not config_file:
        logging.getLogger(__name__).warning(
            "no layouts file (-f/--config): no fleet view, and no KubeVirt CR entry is "
            "added or removed"
        )
    else:
        fleet = FleetViewSettings(
            layouts=FileConfigSource(config_file, catalog),
            settings=Settings(catalog=catalog),
            max_age=parse_duration(max_age),
            interval=fleet_interval,
        )
    settings = ControllerSettings(
        identity=identity or socket.gethostname(),
        namespace=namespace,
        kubevirt=ref,
        grace=grace,
        interval=interval,
        lease_seconds=lease_seconds,
        fleet=fleet,
        catalog=catalog,
        renew_deadline=renew_deadline,
        request_timeout=request_timeout,
    )
    problem = settings.timing_problem()
    if problem is not None:
        raise SelectionError(
            f"--lease-seconds {lease_seconds}, --renew-deadline {renew_deadline:g}, "
            f"--request-timeout {request_timeout:g}, --interval {interval:g}: {problem}"
        )
    # Connect and answer within the request timeout: no request outlives the Lease.
    connect = min(5.0, request_timeout / 3)
    api = KubeApi.connect(kubeconfig, context, timeout=(connect, request_timeout - connect))
    ctl = Controller(api, settings)
    if once:
        result = ctl.run_once()
        if result is None:
            click.echo(f"{settings.identity}: another replica leads; nothing done")
            return
        for change in result.write.changes:
            click.echo(change.describe(result.write.ref))
        for resource, left in result.decision.waiting:
            click.echo(f"  {resource}: reported by no node; removed in {left:.0f} s")
        if result.decision.held:
            click.echo(f"warning: removals suspended: {result.decision.held}", err=True)
        for why in result.decision.refused:
            click.echo(f"warning: VGPUNodeState refused: {why}", err=True)
        for conflict in result.decision.conflicts:
            click.echo(f"warning: {conflict.message}", err=True)
        for report in result.reports:
            if report.outside:
                click.echo(
                    f"warning: node {report.node}: {report.outside.count} vGPU(s) outside the "
                    f"layouts document and the catalog: {report.outside}",
                    err=True,
                )
        if not result.write.changes:
            click.echo(f"KubeVirt CR {result.write.ref}: no changes")
        return
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stops: list[Callable[[], None]] = []
    from vgpu_state.kube.apihealth import Answer, ApiServerHealth, ApiServerProbe

    # /readyz (both ports) fails while the API server or its storage does not answer.
    health = ApiServerHealth(api.server, on_change=ctl.metrics.apiserver_changed)
    probe = ApiServerProbe(api, health)
    probe.start()
    stops.append(lambda: probe.stop(5))
    if webhook_port:
        from pathlib import Path

        from vgpu_state.controller.webhook import WebhookKeeper, WebhookSettings

        # Every replica serves the webhook, leader or not: the Service may route to any.
        keeper = WebhookKeeper(
            api,
            WebhookSettings(
                port=webhook_port,
                namespace=namespace,
                service=webhook_service,
                secret=webhook_secret,
                configuration=webhook_configuration,
                cert_dir=Path(webhook_cert_dir) if webhook_cert_dir else None,
            ),
            catalog,
            readiness=health.check,
        ).start()
        stops.append(keeper.stop)
    if listen:
        from vgpu_state.agent.health import parse_listen
        from vgpu_state.controller.metrics import MetricsServer

        host, port = parse_listen(listen)
        def ready() -> Answer:
            answer = health.check()
            return ctl.watch_check() if answer.ok else answer

        server = MetricsServer(ctl.metrics, host, port, ready).start()
        logging.getLogger(__name__).info(
            "serving /metrics, /healthz and /readyz on %s:%d", host, server.port
        )
    ctl.run(stop)
    for stop_part in stops:
        stop_part()
