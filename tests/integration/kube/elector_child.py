"""Run one leader elector in its own process (the kill -9 test needs a real process death).

Prints "LEADING <identity>" when it starts leading and "STOPPED" when its loops stop; runs
until killed or stdin closes. Usage:
  python -m tests.integration.kube.elector_child KUBECONFIG NAMESPACE LEASE IDENTITY DURATION DEADLINE RETRY
"""
from __future__ import annotations

import sys
import threading

from cephcsi.kube.client import ClientSettings, new_api_client
from cephcsi.kube.leaderelection import LeaderCallbacks, LeaderElectionConfig, LeaderElector
from cephcsi.kube.leaselock import KubeLeaseLock


def main() -> None:
    kubeconfig, namespace, lease, identity, duration, deadline, retry = sys.argv[1:8]
    client = new_api_client(ClientSettings(kubeconfig=kubeconfig))

    def started(stop: threading.Event) -> None:
        print(f"LEADING {identity}", flush=True)
        stop.wait()

    config = LeaderElectionConfig(lease, namespace, identity=identity, lease_duration=float(duration),
                                  renew_deadline=float(deadline), retry_period=float(retry))
    elector = LeaderElector(KubeLeaseLock(client, namespace, lease), config,
                            LeaderCallbacks(started, lambda: print("STOPPED", flush=True)))
    elector.start()
    sys.stdin.read()  # the parent closes stdin (or kills us)
    elector.stop(10)


if __name__ == "__main__":
    main()
