"""`cephcsi` entry point: settings → logging → services → sidecars → wait for a signal."""
from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from cephcsi import __version__
from cephcsi.ceph.leases import LeaseKeeper
from cephcsi.cli.args import fail, parse_settings
from cephcsi.cli.wiring import build_services, start_sidecars
from cephcsi.config.clusters import ClusterRegistry
from cephcsi.errors import CephCSIError
from cephcsi.observability import logging as cephcsi_logging
from cephcsi.observability.health import HealthRegistry, SocketProbe
from cephcsi.observability.http import HealthServer
from cephcsi.observability.logging import fields
from cephcsi.settings import Settings

log = logging.getLogger("cephcsi")


class Lifetime:
    """Ends the process: a signal asks for exit code 0, a fatal loop failure for another."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.exit_code = 0

    def request_exit(self, code: int, reason: str) -> None:
        if not self._event.is_set():
            self.exit_code = code
            (log.info if code == 0 else log.error)("shutting down", extra=fields(reason=reason, exit_code=code))
            self._event.set()

    def wait(self) -> None:
        # A timed wait keeps the main thread responsive to signals.
        while not self._event.wait(1.0):
            pass


def run(settings: Settings) -> int:
    clusters = ClusterRegistry(settings.config_file)
    keeper = LeaseKeeper()
    services = build_services(settings, clusters, keeper)
    if services.node is not None:
        from cephcsi.node.mappers.select import resolve_at_start

        # The default mapper decides whether volumes survive a plugin restart: choose it now,
        # so the start-up log and cephcsi_node_mapper_info show it before any volume is staged.
        resolve_at_start(services.node.service.choice)
        if services.node.service.stale_sweep is not None:
            # Before the node service serves: no NodeStageVolume of this process is half-way.
            services.node.service.stale_sweep.run()
        services.node.service.loop_follower.start()
        if services.node.service.nbd_healer is not None:
            services.node.service.nbd_healer.start()
        if services.node.service.reclaimer is not None:
            services.node.service.reclaimer.start()
    lifetime = Lifetime()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        lifetime.request_exit(0, f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    health = HealthRegistry()
    http: HealthServer | None = None
    if settings.sidecars.http_endpoint:
        http = HealthServer(settings.sidecars.http_endpoint, health)
    for server in services.servers:
        server.start()
        probe = SocketProbe(server.path)
        health.add_liveness(f"csi:{server.path}", probe)
        health.add_readiness(f"csi:{server.path}", probe)
    if settings.sidecars.enabled:
        # The sidecars register their own readiness (informers synced) as they start; until then
        # the process is not ready either, or /readyz would answer 200, then 503, then 200.
        health.add_readiness("sidecars", lambda: "the embedded sidecars are starting")
    if http is not None:
        http.start()
    sidecars = None
    if settings.sidecars.enabled:
        sidecars = start_sidecars(settings, services, health, lifetime.request_exit)
        health.remove("sidecars")
    log.info(
        "cephcsi started",
        extra=fields(version=__version__, mode=settings.mode, driver=settings.driver_name, clusters=clusters.ids(),
                     sidecars=list(settings.sidecars.enabled)),
    )
    lifetime.wait()
    # Order matters: leader-only loops stop (and release the Lease) before the CSI socket goes.
    if sidecars is not None:
        sidecars.stop()
    for server in services.servers:
        server.stop(settings.shutdown_grace)
    # Journal leases released behind answers (CreateVolume): left alone they lapse, but only
    # after --journal-lock-timeout, and the next leader's calls on those volumes would wait.
    if not keeper.drain(settings.shutdown_grace):
        log.warning("journal lease releases still running at exit; those leases lapse on their own")
    if services.node is not None:
        services.node.service.loop_follower.stop()
        if services.node.service.reclaimer is not None:
            services.node.service.reclaimer.stop()
    if http is not None:
        http.stop()
    log.info("cephcsi stopped", extra=fields(exit_code=lifetime.exit_code))
    return lifetime.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["audit"]:
        # A subcommand only as the first word: `cephcsi --mode=...` parses exactly as before.
        from cephcsi.cli.audit import main as audit_main

        return audit_main(args[1:])
    if args[:1] == ["rotate-key"]:
        from cephcsi.cli.rotate_key import main as rotate_key_main

        return rotate_key_main(args[1:])
    settings = parse_settings(argv)
    cephcsi_logging.configure(settings.log_level, settings.log_json)
    try:
        return run(settings)
    except CephCSIError as error:
        fail(str(error))


if __name__ == "__main__":
    raise SystemExit(main())
