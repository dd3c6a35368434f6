"""Typed settings of one cephcsi process, built from the command line by cephcsi.cli.args.

Defaults match the kubernetes-csi sidecars and ceph-csi where users know them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

RECLAIMSPACE_POLL_INTERVAL = 60.0
"""The leader's reclaim-space pass (its informer cache only): --reclaimspace-poll-interval's
default in controller and all modes."""
NODE_RECLAIMSPACE_POLL_INTERVAL = 600.0
"""The node-mode default. The node plugin's pass reads one claim per published volume from the
API (200 nodes with 50 volumes each: about 17 reads a second at 10 minutes, 170 at one) and a
schedule names at most one run an hour, so a trim that starts up to 10 minutes after the leader
recorded its run loses nothing."""


@dataclass(frozen=True)
class CephSettings:
    """Bounds on every Ceph call, so a stuck cluster yields an error instead of a hung RPC."""

    osd_op_timeout: float = 30.0
    """rados_osd_op_timeout: seconds an OSD operation may take."""
    mon_op_timeout: float = 30.0
    """rados_mon_op_timeout: seconds a monitor command may take."""
    mount_timeout: float = 10.0
    """client_mount_timeout: seconds to connect and authenticate to the monitors."""
    connection_idle_seconds: float = 600.0
    """A cached connection unused this long is shut down."""
    journal_lock_seconds: float = 10.0
    """Duration of a create/delete's cross-process journal lease, renewed while the call runs.
    A process killed while holding one blocks that volume (ABORTED) for at most this long."""
    inline_purge_seconds: float = 20.0
    """How long a DeleteVolume waits for an inline trash purge (only when the mgr refuses the
    background task) before answering UNAVAILABLE; the purge goes on and a retry joins it."""
    rbd_hand_writes: str = "auto"
    """--rbd-hand-writes: `auto` writes new images and trash moves by hand only on Ceph releases
    verified against librbd (cephcsi.ceph.verified), `always` wherever the layout allows,
    `never` leaves every image object to librbd."""
    connect_failure_memory: float = 5.0
    """A failed connect is answered from memory to every caller for this long (at most
    mount_timeout), then retried: callers fail at once instead of each waiting a mount timeout,
    the monitors see one attempt per interval, and a recovered cluster is used seconds later."""

    @property
    def failure_memory_seconds(self) -> float:
        # Never longer than one attempt takes: remembering a failure must not delay recovery by
        # more than the outage already costs a caller.
        return max(0.0, min(self.connect_failure_memory, self.mount_timeout))


@dataclass(frozen=True)
class SnapshotSettings:
    """Clone-chain flatten policy (ceph-csi's flags; see cephcsi.volumes.flatten)."""

    soft_max_clone_depth: int = 4
    """--rbdsoftmaxclonedepth: deeper new images are flattened in the background."""
    hard_max_clone_depth: int = 8
    """--rbdhardmaxclonedepth: snapshots deeper than this are not ready until flattened."""
    min_snapshots_on_image: int = 250
    """--minsnapshotsonimage: from this many snapshots on an image, its oldest clones are flattened."""
    max_snapshots_on_image: int = 450
    """--maxsnapshotsonimage: the snapshot budget of an image (warned about when exceeded)."""


@dataclass(frozen=True)
class NodeSettings:
    node_id: str = ""
    """This node's name (Kubernetes Node name); required in node mode."""
    kubelet_dir: str = "/var/lib/kubelet"
    """Staging and target paths must lie under it (empty: no prefix check)."""
    state_dir: str = "/var/lib/cephcsi"
    """Driver-private state on the host (userspace-mapper mounts); must survive restarts."""
    runtime_dir: str = "/run/cephcsi"
    """Driver state that must survive a plugin restart but not a reboot, on the host's tmpfs: the
    rbd-nbd re-attach records, which hold a cephx key and so must never reach a disk."""
    mounter: str = "auto"
    """Default mapper: auto | krbd | rbd-nbd | fuse (the userspace rbd-fuse + loop mapper)."""
    domain_labels: tuple[str, ...] = ()
    """Node labels that make up the topology domain (enables VOLUME_ACCESSIBILITY_CONSTRAINTS)."""
    read_affinity_labels: tuple[str, ...] = ()
    """--crush-location-labels when --enable-read-affinity is on: used for clusters whose
    config.json readAffinity is enabled without labels of its own (as ceph-csi does)."""
    max_volumes_per_node: int = 0
    """Reported in NodeGetInfo; 0 means no limit."""
    device_timeout: float = 30.0
    """Seconds to wait for a mapped device node to appear."""
    command_timeout: float = 120.0
    """Upper bound for one external command (rbd map, mkfs, mount...)."""


@dataclass(frozen=True)
class CapacitySettings:
    """external-provisioner's capacity flags, with its defaults (see cephcsi.sidecars.capacity)."""

    enabled: bool = False
    """--enable-capacity: CSIStorageCapacity objects from GetCapacity (deploy/ turns it on)."""
    poll_interval: float = 60.0
    """--capacity-poll-interval: how often every object's figure is refreshed."""
    immediate_binding: bool = False
    """--capacity-for-immediate-binding: also for classes with Immediate binding."""
    ownerref_level: int = 1
    """--capacity-ownerref-level: owner of the objects, counted from the controller's Pod
    (POD_NAME): -1 none, 0 the Pod, 1 its ReplicaSet, 2 the Deployment."""


@dataclass(frozen=True)
class SidecarSettings:
    enabled: tuple[str, ...] = ("provisioner", "attacher", "resizer")
    """Loops to run in controller mode (`--sidecars`); registrar in node mode."""
    kubeconfig: str = ""
    """Path to a kubeconfig; empty means in-cluster config."""
    leader_election: bool = True
    leader_election_namespace: str = ""
    """Namespace of the Lease; empty means the pod's own namespace."""
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    worker_threads: int = 100
    timeout: float = 60.0
    """Deadline for one CreateVolume/DeleteVolume issued by the provisioner."""
    retry_interval_start: float = 1.0
    retry_interval_max: float = 300.0
    kube_api_qps: float = 50.0
    kube_api_burst: int = 100
    http_endpoint: str = ""
    """host:port for /healthz, /readyz and /metrics; empty disables the HTTP server."""
    extra_create_metadata: bool = False
    topology: bool = False
    """--feature-gates=Topology=true: the controller advertises VOLUME_ACCESSIBILITY_CONSTRAINTS,
    so its provisioner sends accessibility requirements and writes PV node affinity (opt-in, as
    external-provisioner's gate and ceph-csi's chart)."""
    strict_topology: bool = False
    """--strict-topology: a WaitForFirstConsumer claim asks for its node's segment only."""
    immediate_topology: bool = True
    """--immediate-topology: an Immediate claim without allowedTopologies asks for every node's segment."""
    default_fstype: str = "ext4"
    kubelet_registration_path: str = ""
    capacity: CapacitySettings = field(default_factory=CapacitySettings)
    """Capacity tracking (CSIStorageCapacity objects), part of the provisioner."""
    """CSI socket path as the kubelet sees it (registrar); default derives from --kubelet-dir."""
    reclaimspace_poll_interval: float = RECLAIMSPACE_POLL_INTERVAL
    """--reclaimspace-poll-interval: how often the leader checks the claims' reclaim-space
    schedules (cephcsi.sidecars.reclaimspace), or in node mode the node plugin the claims of its
    staged volumes (cephcsi.node.reclaim_loop); 0 turns the loop off. The flag's default depends
    on the mode (RECLAIMSPACE_POLL_INTERVAL, NODE_RECLAIMSPACE_POLL_INTERVAL)."""


@dataclass(frozen=True)
class Settings:
    mode: str
    """controller | node | all."""
    endpoint: str = "unix:///csi/csi.sock"
    controller_endpoint: str = ""
    """Optional second socket for the Controller service (then `endpoint` serves Identity+Node)."""
    driver_name: str = "rbd.csi.ceph.com"
    instance_id: str = "default"
    """Journal instance: drivers sharing a pool with different ids keep separate name spaces."""
    config_file: str = "/etc/ceph-csi-config/config.json"
    kms_config: str = "/etc/ceph-csi-encryption-kms-config/config.json"
    """The KMS sections encrypted volumes name (encryptionKMSID), ceph-csi's ConfigMap format."""
    log_level: str = "info"
    log_json: bool = False
    grpc_workers: int = 32
    slow_call_seconds: float = 10.0
    shutdown_grace: float = 10.0
    ceph: CephSettings = field(default_factory=CephSettings)
    snapshots: SnapshotSettings = field(default_factory=SnapshotSettings)
    node: NodeSettings = field(default_factory=NodeSettings)
    sidecars: SidecarSettings = field(default_factory=SidecarSettings)

    @property
    def serves_controller(self) -> bool:
        return self.mode in ("controller", "all")

    @property
    def serves_node(self) -> bool:
        return self.mode in ("node", "all")
