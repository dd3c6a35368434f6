"""What a failed volume assertion reports, so that a flake seen once in CI can be explained from
its log alone: the node plugin's state and log lines about the volume, what the kubelet logged
about it, the node's mounts and loop devices of it, and the workload container's own view of
its mount (its mount namespace can differ from the node's)."""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from tests.e2e import host
from tests.e2e.env import E2EEnv
from tests.e2e.kube import DEPLOY_NAMESPACE, NODE_LABELS, image_name
from tests.e2e.nodehost import KUBELET_ROOT

LINES = 60
"""Lines kept of each log (the most recent ones that name the volume)."""


def volume_report(e2e: E2EEnv, namespace: str, pod: str, pv: dict[str, Any], mount_path: str = "/data") -> str:
    handle: str = pv["spec"]["csi"]["volumeHandle"]
    keys = (pv["metadata"]["name"], handle, hashlib.sha256(handle.encode()).hexdigest(), image_name(pv))
    sections: list[tuple[str, Callable[[], str]]] = [
        ("node plugin pods", lambda: _node_plugins(e2e)),
        ("node plugin log lines of the volume", lambda: _node_plugin_lines(e2e, keys)),
        ("kubelet log lines of the volume", lambda: _kubelet_lines(e2e, keys)),
        ("node mounts of the volume", lambda: "\n".join(
            f"{m.source} on {m.mount_point}" for m in host.mounts_under(str(KUBELET_ROOT))
            if any(key in m.mount_point for key in keys)) or "none"),
        ("loop devices", lambda: "\n".join(f"{dev}: {back}" for dev, back in host.loop_devices()) or "none"),
        (f"{namespace}/{pod} events", lambda: e2e.kube.events(namespace, pod)),
        (f"{namespace}/{pod} view of {mount_path}", lambda: _container_view(e2e, namespace, pod, mount_path)),
    ]
    return "\n".join(f"--- {title} ---\n{_safely(read)}" for title, read in sections)


def _safely(read: Callable[[], str]) -> str:
    """A section that cannot be read says why instead of hiding the failure it should explain."""
    try:
        return read()
    except Exception as error:  # noqa: BLE001 - diagnostics only
        return f"(not readable: {error})"


def _node_plugins(e2e: E2EEnv) -> str:
    lines = []
    for pod in e2e.kube.pods(DEPLOY_NAMESPACE, NODE_LABELS):
        statuses = pod.get("status", {}).get("containerStatuses") or []
        restarts = {s["name"]: s.get("restartCount") for s in statuses}
        lines.append(f"{pod['metadata']['name']} uid={pod['metadata']['uid']} restarts={restarts}")
    return "\n".join(lines) or "none"


def _node_plugin_lines(e2e: E2EEnv, keys: tuple[str, ...]) -> str:
    out = []
    for pod in e2e.kube.pods(DEPLOY_NAMESPACE, NODE_LABELS):
        name = pod["metadata"]["name"]
        for previous in (True, False):
            text = e2e.kube.logs(name, previous=previous)
            lines = [line for line in text.splitlines() if any(key in line for key in keys)]
            out.append(f"{name}{' (previous container)' if previous else ''}:\n" + "\n".join(lines[-LINES:]))
    return "\n".join(out) or "no node plugin"


def _kubelet_lines(e2e: E2EEnv, keys: tuple[str, ...]) -> str:
    try:
        text = (e2e.node.logs / "kubelet.log").read_text(errors="replace")
    except OSError as error:
        return f"(unreadable: {error})"
    lines = [line for line in text.splitlines() if any(key in line for key in keys)]
    return "\n".join(lines[-LINES:]) or "none"


def _container_view(e2e: E2EEnv, namespace: str, pod: str, mount_path: str) -> str:
    script = f"grep ' {mount_path} ' /proc/self/mountinfo; ls -la {mount_path}"
    return e2e.kube.exec_in(namespace, pod, script, timeout=30)

