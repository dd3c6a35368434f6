"""How section 1 calls the driver: single gRPC calls from this process (warm-up, RADOS operation
counts), and batches in-process as the embedded provisioner calls (bench.embedded); the timed gRPC
batches come from Go (bench.go_caller)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from bench import procstat
from bench.embedded import EmbeddedController
from bench.environment import DRIVER_ARGS, Environment
from bench.load import TimedBatch, run_batch
from cephcsi._generated import csi_pb2
from cephcsi.volumes.metadata import PV_NAME_KEY, PVC_NAME_KEY, PVC_NAMESPACE_KEY

RPC_TIMEOUT_S = 120.0
Mode = csi_pb2.VolumeCapability.AccessMode


OWNER_NAMESPACE = "bench"


def _create_request(env: Environment, name: str, owner_keys: bool = False) -> csi_pb2.CreateVolumeRequest:
    """With `owner_keys`, the parameters the embedded provisioner adds under deploy/'s
    `--extra-create-metadata` (claim name and namespace, PV name), which the driver writes to the
    new image as metadata: the shipped path's CreateVolume."""
    cluster = env.start_cluster()
    parameters = dict(cluster.parameters)
    if owner_keys:
        parameters.update({PVC_NAME_KEY: name, PVC_NAMESPACE_KEY: OWNER_NAMESPACE, PV_NAME_KEY: name})
    return csi_pb2.CreateVolumeRequest(
        name=name,
        capacity_range=csi_pb2.CapacityRange(required_bytes=env.options.size_bytes),
        volume_capabilities=[csi_pb2.VolumeCapability(
            mount=csi_pb2.VolumeCapability.MountVolume(), access_mode=Mode(mode=Mode.SINGLE_NODE_WRITER))],
        parameters=parameters,
        secrets=cluster.secrets,
    )


class DriverClient:
    """Single calls over gRPC from this process: the warm-up and the RADOS operation counts (the
    timed rounds call from Go, bench.go_caller)."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        self.stub = env.controller().controller
        self.secrets = env.start_cluster().secrets

    def create(self, name: str) -> str:
        reply = self.stub.CreateVolume(_create_request(self.env, name), timeout=RPC_TIMEOUT_S)
        return str(reply.volume.volume_id)

    def delete(self, volume_id: str) -> None:
        self.stub.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=self.secrets),
                               timeout=RPC_TIMEOUT_S)


class EmbeddedClient:
    """The same calls in-process (bench.embedded), as the embedded provisioner makes them."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        self.secrets = env.start_cluster().secrets
        assert env.config_file is not None
        self.controller = EmbeddedController(str(env.config_file), DRIVER_ARGS, env.workdir / "embedded-controller.log")

    def create(self, name: str) -> str:
        return self.controller.create(_create_request(self.env, name, owner_keys=True))

    def delete(self, volume_id: str) -> str:
        self.controller.delete(csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=self.secrets))
        return volume_id

    def close(self) -> None:
        self.controller.close()


SideCall = Callable[[Sequence[str], int], TimedBatch]
"""One batch of a path's calls at a concurrency, with the CPU they cost."""


def in_process(op: Callable[[str], str]) -> SideCall:
    """A batch of in-process calls: the driver runs in this process, so its CPU is this process's."""
    def batch(items: Sequence[str], c: int) -> TimedBatch:
        cpu0 = procstat.self_cpu_seconds()
        done = run_batch(op, items, c)
        return TimedBatch(done, procstat.self_cpu_seconds() - cpu0)
    return batch
