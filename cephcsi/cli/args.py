"""Command line → Settings. Flag names follow ceph-csi and the kubernetes-csi sidecars."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from cephcsi import __version__
from cephcsi.settings import (
    NODE_RECLAIMSPACE_POLL_INTERVAL, RECLAIMSPACE_POLL_INTERVAL, CapacitySettings, CephSettings, NodeSettings, Settings,
    SidecarSettings, SnapshotSettings,
)

MODES = ("controller", "node", "all")
CONTROLLER_LOOPS = ("provisioner", "attacher", "resizer", "snapshotter")
NODE_LOOPS = ("registrar",)
MOUNTERS = ("auto", "krbd", "rbd-nbd", "fuse")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line a person can act on, not the usage dump.
        self.exit(2, f"cephcsi: error: {message} (see cephcsi --help)\n")


def _positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
        return value

    parse.__name__ = kind.__name__
    return parse


def _lease_duration(text: str) -> float:
    """A journal lease: Ceph's cls_lock keeps whole seconds, so below 1 s is refused rather than
    silently lengthened, and a fraction is dropped."""
    value = _duration(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is below 1s: Ceph's locks last whole seconds")
    return float(int(value))


def _duration(text: str) -> float:
    """Seconds as a number or Go-style `15s`, `2m`, `1h`, `500ms` (the sidecars' flag format)."""
    units = (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0))
    for suffix, scale in units:
        if text.endswith(suffix) and text[: -len(suffix)].replace(".", "", 1).isdigit():
            return float(text[: -len(suffix)]) * scale
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 10s, 2m or 1.5") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


FEATURE_GATES = ("Topology",)
"""external-provisioner's gates this driver knows; Topology is the only one that changes anything."""


def _feature_gates(text: str) -> dict[str, bool]:
    gates: dict[str, bool] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in FEATURE_GATES:
            raise argparse.ArgumentTypeError(
                f"{item!r} is not Gate=true|false with a known gate ({', '.join(FEATURE_GATES)})")
        gates[key.strip()] = _bool(value.strip())
    return gates


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="cephcsi", description="Ceph RBD CSI driver with the CSI sidecars embedded.",
                epilog="Also: `cephcsi audit --help` (find and repair journal/pool inconsistencies).")
    p.add_argument("--version", action="version", version=f"cephcsi {__version__}")
    for add_group in (_driver_flags, _ceph_flags, _flatten_flags, _node_flags, _sidecar_flags):
        add_group(p)
    return p


def _driver_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("driver")
    g.add_argument("--mode", choices=MODES, required=True, help="controller: Identity+Controller (+provisioner, attacher, resizer, snapshotter); node: Identity+Node (+registrar); all: everything")
    g.add_argument("--endpoint", default="unix:///csi/csi.sock", help="CSI socket (default %(default)s)")
    g.add_argument("--controllerendpoint", default="", help="serve the Controller service on this second socket instead")
    g.add_argument("--drivername", default="rbd.csi.ceph.com", help="CSI driver name (default %(default)s)")
    g.add_argument("--nodeid", default="", help="this node's name; required with --mode=node/all")
    g.add_argument("--instanceid", default="default", help="journal instance id (default %(default)s)")
    g.add_argument("--config-file", default="/etc/ceph-csi-config/config.json", help="cluster list, ceph-csi format")
    g.add_argument("--kms-config", default="/etc/ceph-csi-encryption-kms-config/config.json",
                   help="KMS configuration of encrypted volumes, ceph-csi's ceph-csi-encryption-kms-config format")
    g.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    g.add_argument("--log-json", type=_bool, nargs="?", const=True, default=False, help="log JSON lines")
    g.add_argument("--grpc-workers", type=_positive(int), default=32, help="concurrent CSI calls")
    g.add_argument("--slow-call-threshold", type=_duration, default=10.0, help="warn about calls slower than this")
    g.add_argument("--shutdown-grace", type=_duration, default=10.0, help="time in-flight calls get on SIGTERM")


def _ceph_flags(p: argparse.ArgumentParser) -> None:
    c = p.add_argument_group("ceph")
    c.add_argument("--rados-osd-op-timeout", type=_duration, default=30.0)
    c.add_argument("--journal-lock-timeout", type=_lease_duration, default=10.0,
                   help="lease on a volume's journal entry, renewed while a call runs; a killed holder blocks the volume at most "
                        "this long (whole seconds, at least 1s)")
    c.add_argument("--rados-mon-op-timeout", type=_duration, default=30.0)
    c.add_argument("--client-mount-timeout", type=_duration, default=10.0)
    c.add_argument("--rbd-hand-writes", choices=("auto", "always", "never"), default="auto",
                   help="write new images and trash moves without librbd: auto = only on Ceph releases verified "
                        "against librbd (cluster and client), always, never")


def _flatten_flags(p: argparse.ArgumentParser) -> None:
    f = p.add_argument_group("snapshots and clones (flatten policy, ceph-csi's flags)")
    f.add_argument("--rbdsoftmaxclonedepth", type=_positive(int), default=4,
                   help="new images deeper than this are flattened in the background (default %(default)s)")
    f.add_argument("--rbdhardmaxclonedepth", type=_positive(int), default=8,
                   help="snapshots deeper than this report ready_to_use=false until flattened (default %(default)s)")
    f.add_argument("--minsnapshotsonimage", type=_positive(int), default=250,
                   help="from this many snapshots on an image its oldest clones are flattened (default %(default)s)")
    f.add_argument("--maxsnapshotsonimage", type=_positive(int), default=450,
                   help="snapshot budget of an image; warned about when exceeded (default %(default)s)")


def _node_flags(p: argparse.ArgumentParser) -> None:
    n = p.add_argument_group("node")
    n.add_argument("--kubelet-dir", default="/var/lib/kubelet", help="staging/target paths must be under it ('' disables)")
    n.add_argument("--state-dir", default="/var/lib/cephcsi", help="driver state on the host")
    n.add_argument("--runtime-dir", default="/run/cephcsi",
                   help="driver state kept across plugin restarts but not reboots, on tmpfs (rbd-nbd re-attach records)")
    n.add_argument("--mounter", choices=MOUNTERS, default="auto", help="default mapper (StorageClass 'mounter' overrides)")
    n.add_argument("--domainlabels", default="", help="comma-separated node labels forming the topology")
    n.add_argument("--enable-read-affinity", type=_bool, nargs="?", const=True, default=False,
                   help="with --crush-location-labels: the labels for config.json entries whose readAffinity is "
                        "enabled without crushLocationLabels (ceph-csi's flag)")
    n.add_argument("--crush-location-labels", default="",
                   help="comma-separated node labels giving the node's CRUSH location for read affinity")
    n.add_argument("--max-volumes-per-node", type=int, default=0)
    n.add_argument("--device-timeout", type=_duration, default=30.0)
    n.add_argument("--kubelet-registration-path", default="", help="CSI socket path as the kubelet sees it")


def _sidecar_flags(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("embedded sidecars")
    s.add_argument("--sidecars", default="", help="comma list of loops to run, or 'none' (default: provisioner,attacher,resizer,snapshotter in controller mode, registrar in node mode)")
    s.add_argument("--kubeconfig", default="", help="kubeconfig path (default: in-cluster config)")
    s.add_argument("--leader-election", type=_bool, nargs="?", const=True, default=True)
    s.add_argument("--leader-election-namespace", default="")
    s.add_argument("--leader-election-lease-duration", type=_duration, default=15.0)
    s.add_argument("--leader-election-renew-deadline", type=_duration, default=10.0)
    s.add_argument("--leader-election-retry-period", type=_duration, default=2.0)
    s.add_argument("--worker-threads", type=_positive(int), default=100)
    s.add_argument("--timeout", type=_duration, default=60.0, help="deadline of one provisioner CSI call")
    s.add_argument("--retry-interval-start", type=_duration, default=1.0)
    s.add_argument("--retry-interval-max", type=_duration, default=300.0)
    s.add_argument("--kube-api-qps", type=_positive(float), default=50.0)
    s.add_argument("--kube-api-burst", type=_positive(int), default=100)
    s.add_argument("--http-endpoint", default="", help="host:port for /healthz, /readyz, /metrics")
    s.add_argument("--extra-create-metadata", type=_bool, nargs="?", const=True, default=False)
    s.add_argument("--feature-gates", type=_feature_gates, default="",
                   help="external-provisioner's gates: Topology=true makes the controller advertise "
                        "VOLUME_ACCESSIBILITY_CONSTRAINTS and the provisioner send accessibility requirements "
                        "(needed by topologyConstrainedPools; the nodes need --domainlabels)")
    s.add_argument("--strict-topology", type=_bool, nargs="?", const=True, default=False,
                   help="with topology: a WaitForFirstConsumer claim's CreateVolume requires the selected node's "
                        "segment only (default: every segment, the node's preferred)")
    s.add_argument("--immediate-topology", type=_bool, nargs="?", const=True, default=True,
                   help="with topology: an Immediate claim without allowedTopologies requires one of the nodes' "
                        "segments (false: no requirement, the class pool)")
    s.add_argument("--default-fstype", default="ext4")
    s.add_argument("--enable-capacity", type=_bool, nargs="?", const=True, default=False,
                   help="publish CSIStorageCapacity objects from GetCapacity (with the provisioner)")
    s.add_argument("--capacity-poll-interval", type=_duration, default=60.0)
    s.add_argument("--capacity-for-immediate-binding", type=_bool, nargs="?", const=True, default=False)
    s.add_argument("--reclaimspace-poll-interval", type=_duration, default=None,
                   help="how often the leader checks the claims' reclaim-space schedules, and the node plugin "
                        "the claims of its staged volumes (0: off; default 1m in controller mode, 10m in node mode)")
    s.add_argument("--capacity-ownerref-level", type=int, default=1,
                   help="owner of CSIStorageCapacity objects: -1 none, 0 the Pod (POD_NAME), 1 its ReplicaSet, "
                        "2 its Deployment")


def _loops(text: str, mode: str, parser: argparse.ArgumentParser) -> tuple[str, ...]:
    allowed = {"controller": CONTROLLER_LOOPS, "node": NODE_LOOPS, "all": CONTROLLER_LOOPS + NODE_LOOPS}[mode]
    if text == "none":
        return ()
    if not text:
        return allowed
    chosen = tuple(item.strip() for item in text.split(",") if item.strip())
    unknown = [item for item in chosen if item not in allowed]
    if unknown:
        parser.error(f"--sidecars: {', '.join(unknown)} cannot run in --mode={mode} (choose from {', '.join(allowed)} or none)")
    return chosen


def parse_settings(argv: Sequence[str] | None = None) -> Settings:
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.mode in ("node", "all") and not a.nodeid:
        parser.error(f"--nodeid is required with --mode={a.mode}")
    if a.leader_election_renew_deadline >= a.leader_election_lease_duration:
        parser.error("--leader-election-renew-deadline must be shorter than --leader-election-lease-duration")
    if a.leader_election_retry_period >= a.leader_election_renew_deadline:
        parser.error("--leader-election-retry-period must be shorter than --leader-election-renew-deadline")
    if a.capacity_poll_interval < 1:
        parser.error("--capacity-poll-interval must be at least 1s")
    if a.reclaimspace_poll_interval is not None and 0 < a.reclaimspace_poll_interval < 1:
        parser.error("--reclaimspace-poll-interval must be 0 (off) or at least 1s")
    if a.capacity_ownerref_level < -1:
        parser.error("--capacity-ownerref-level must be -1 (no owner) or more")
    return _settings(a, parser)


def _settings(a: argparse.Namespace, parser: argparse.ArgumentParser) -> Settings:
    return Settings(
        mode=a.mode,
        endpoint=a.endpoint,
        controller_endpoint=a.controllerendpoint,
        driver_name=a.drivername,
        instance_id=a.instanceid,
        config_file=a.config_file,
        kms_config=a.kms_config,
        log_level=a.log_level,
        log_json=a.log_json,
        grpc_workers=a.grpc_workers,
        slow_call_seconds=a.slow_call_threshold,
        shutdown_grace=a.shutdown_grace,
        ceph=CephSettings(
            osd_op_timeout=a.rados_osd_op_timeout,
            mon_op_timeout=a.rados_mon_op_timeout,
            mount_timeout=a.client_mount_timeout,
            journal_lock_seconds=a.journal_lock_timeout,
            rbd_hand_writes=a.rbd_hand_writes,
        ),
        snapshots=SnapshotSettings(
            soft_max_clone_depth=a.rbdsoftmaxclonedepth,
            hard_max_clone_depth=a.rbdhardmaxclonedepth,
            min_snapshots_on_image=a.minsnapshotsonimage,
            max_snapshots_on_image=a.maxsnapshotsonimage,
        ),
        node=_node_settings(a),
        sidecars=_sidecar_settings(a, parser),
    )


def _node_settings(a: argparse.Namespace) -> NodeSettings:
    return NodeSettings(
        node_id=a.nodeid,
        kubelet_dir=a.kubelet_dir,
        state_dir=a.state_dir,
        runtime_dir=a.runtime_dir,
        mounter=a.mounter,
        domain_labels=tuple(x.strip() for x in a.domainlabels.split(",") if x.strip()),
        read_affinity_labels=(tuple(x.strip() for x in a.crush_location_labels.split(",") if x.strip())
                              if a.enable_read_affinity else ()),
        max_volumes_per_node=a.max_volumes_per_node,
        device_timeout=a.device_timeout,
    )


def _sidecar_settings(a: argparse.Namespace, parser: argparse.ArgumentParser) -> SidecarSettings:
    return SidecarSettings(
        enabled=_loops(a.sidecars, a.mode, parser),
        kubeconfig=a.kubeconfig,
        leader_election=a.leader_election,
        leader_election_namespace=a.leader_election_namespace,
        lease_duration=a.leader_election_lease_duration,
        renew_deadline=a.leader_election_renew_deadline,
        retry_period=a.leader_election_retry_period,
        worker_threads=a.worker_threads,
        timeout=a.timeout,
        retry_interval_start=a.retry_interval_start,
        retry_interval_max=a.retry_interval_max,
        kube_api_qps=a.kube_api_qps,
        kube_api_burst=a.kube_api_burst,
        http_endpoint=a.http_endpoint,
        extra_create_metadata=a.extra_create_metadata,
        topology=a.feature_gates.get("Topology", False),
        strict_topology=a.strict_topology,
        immediate_topology=a.immediate_topology,
        default_fstype=a.default_fstype,
        kubelet_registration_path=a.kubelet_registration_path,
        capacity=CapacitySettings(a.enable_capacity, a.capacity_poll_interval, a.capacity_for_immediate_binding,
                                  a.capacity_ownerref_level),
        reclaimspace_poll_interval=_reclaimspace_interval(a),
    )


def _reclaimspace_interval(a: argparse.Namespace) -> float:
    """The flag's value, else the mode's default: the node pass reads the API for each staged
    volume and has nothing to do more than once per recorded run (at most hourly), so it polls
    less often than the leader, whose pass reads only its informer cache."""
    if a.reclaimspace_poll_interval is not None:
        return float(a.reclaimspace_poll_interval)
    return NODE_RECLAIMSPACE_POLL_INTERVAL if a.mode == "node" else RECLAIMSPACE_POLL_INTERVAL


def fail(message: str) -> NoReturn:
    sys.stderr.write(f"cephcsi: error: {message}\n")
    raise SystemExit(1)
