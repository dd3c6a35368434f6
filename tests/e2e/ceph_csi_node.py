"""A test stand-in for ceph-csi's RBD node plugin (its csi-rbdplugin container plus the
node-driver-registrar sidecar), run as a host process by tests/e2e/test_migration.py.

Why a stand-in: ceph-csi's real node plugin cannot run on these machines (the kernel has no rbd
or nbd module, so it could map nothing, and no registry serves its image). What the migration
guide needs from it is what it leaves on the node for cephcsi to take over, and that is
reproduced exactly:
- it registers with the kubelet as rbd.csi.ceph.com through
  `<kubelet>/plugins_registry/rbd.csi.ceph.com-reg.sock`, as node-driver-registrar does (GetInfo,
  NotifyRegistrationStatus; the socket is removed on SIGTERM), with its CSI socket at
  `<kubelet>/plugins/rbd.csi.ceph.com/csi.sock`: the same paths cephcsi's node plugin uses;
- NodeStageVolume writes ceph-csi's stash `<staging>/image-meta.json` (internal/rbd/rbd_util.go
  rbdImageMetadataStash, Version 3, json.Marshal's field order, mode 0600) before mapping,
  then mounts a Filesystem volume at the directory `<staging>/<volume id>` (formatted only when
  blkid finds nothing, mounted with `_netdev` and the mount flags) or bind-mounts a Block
  volume's device onto the file `<staging>/<volume id>` (internal/rbd/nodeserver.go);
- NodePublishVolume bind-mounts `<staging>/<volume id>` onto the target.

What differs is the mapping: ceph-csi maps with krbd (its default, which the stash records:
`accessType` false), this maps with rbd-fuse plus a loop device, the only mapper this kernel
allows. The rbd-fuse daemons and loop devices outlive this process, as krbd mappings outlive
ceph-csi's pod; after cephcsi's NodeUnstage (whose krbd unmap finds nothing here) the test tears
them down itself. Only what the walk needs is served: no unstage, stats or expansion.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from cephcsi._generated import csi_pb2, csi_pb2_grpc
from cephcsi._generated import pluginregistration_pb2 as reg_pb2
from cephcsi._generated import pluginregistration_pb2_grpc as reg_grpc

log = logging.getLogger("ceph-csi-stand-in")
DRIVER = "rbd.csi.ceph.com"
STASH = "image-meta.json"
REGISTERED = "registered"
"""File the stand-in writes into its work folder once the kubelet accepted the registration."""


def run(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-1000:]}")
    return proc.stdout


def is_mount_point(path: str) -> bool:
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        return any(line.split()[4] == path for line in handle)


def stash(pool: str, image: str, unmap_options: str) -> bytes:
    """ceph-csi's image-meta.json for a krbd stage, byte for byte as Go's json.Marshal writes it."""
    doc = {"Version": 3, "pool": pool, "radosNamespace": "", "image": image, "unmapOptions": unmap_options,
           "accessType": False, "encrypted": False, "device": "", "logDir": "", "logFileStrategy": ""}
    return json.dumps(doc, separators=(",", ":")).encode()


class Mapper:
    """rbd-fuse + loop device per image, under `work_dir/<image>` (the stand-in for krbd)."""

    def __init__(self, ceph_conf: str, work_dir: Path) -> None:
        self.ceph_conf = ceph_conf
        self.work_dir = work_dir

    def map(self, pool: str, image: str) -> str:
        fuse_dir = self.work_dir / image
        image_file = fuse_dir / image
        if not is_mount_point(str(fuse_dir)):
            fuse_dir.mkdir(parents=True, exist_ok=True)
            # rbd-fuse daemonizes once the mount is up; waiting for the parent avoids a zombie.
            run(["rbd-fuse", "-c", self.ceph_conf, "-p", pool, "-r", image, str(fuse_dir)])
        for line in run(["losetup", "-j", str(image_file)]).splitlines():
            return line.split(":", 1)[0]
        return run(["losetup", "--find", "--show", "--direct-io=on", str(image_file)]).strip()


class Node(csi_pb2_grpc.NodeServicer):
    def __init__(self, node_id: str, mapper: Mapper) -> None:
        self.node_id = node_id
        self.mapper = mapper
        self.lock = threading.Lock()

    def NodeGetInfo(self, request: csi_pb2.NodeGetInfoRequest,  # noqa: N802
                    context: grpc.ServicerContext) -> csi_pb2.NodeGetInfoResponse:
        return csi_pb2.NodeGetInfoResponse(node_id=self.node_id)

    def NodeGetCapabilities(self, request: csi_pb2.NodeGetCapabilitiesRequest,  # noqa: N802
                            context: grpc.ServicerContext) -> csi_pb2.NodeGetCapabilitiesResponse:
        rpc = csi_pb2.NodeServiceCapability.RPC
        return csi_pb2.NodeGetCapabilitiesResponse(capabilities=[
            csi_pb2.NodeServiceCapability(rpc=rpc(type=rpc.STAGE_UNSTAGE_VOLUME))])

    def NodeStageVolume(self, request: csi_pb2.NodeStageVolumeRequest,  # noqa: N802
                        context: grpc.ServicerContext) -> csi_pb2.NodeStageVolumeResponse:
        staging = request.staging_target_path
        target = os.path.join(staging, request.volume_id)
        attributes = request.volume_context
        block = request.volume_capability.HasField("block")
        with self.lock:
            if is_mount_point(target):
                return csi_pb2.NodeStageVolumeResponse()
            # ceph-csi stashes before mapping, so that unstage finds the image even after a
            # failed map.
            path = os.path.join(staging, STASH)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(stash(attributes["pool"], attributes["imageName"],
                                   attributes.get("unmapOptions", "")))
            device = self.mapper.map(attributes["pool"], attributes["imageName"])
            if block:
                os.close(os.open(target, os.O_CREAT | os.O_RDWR, 0o600))
                run(["mount", "--bind", device, target])
            else:
                mount = request.volume_capability.mount
                fs_type = mount.fs_type or "ext4"
                os.makedirs(target, 0o750, exist_ok=True)
                if subprocess.run(["blkid", "-p", device], capture_output=True, check=False).returncode == 2:
                    run([f"mkfs.{fs_type}", "-q", device] if fs_type == "ext4" else [f"mkfs.{fs_type}", device])
                options = ",".join(["_netdev", *mount.mount_flags])
                run(["mount", "-t", fs_type, "-o", options, device, target])
                os.chmod(target, 0o777)
        log.info("staged %s at %s (%s)", request.volume_id, target, device)
        return csi_pb2.NodeStageVolumeResponse()

    def NodePublishVolume(self, request: csi_pb2.NodePublishVolumeRequest,  # noqa: N802
                          context: grpc.ServicerContext) -> csi_pb2.NodePublishVolumeResponse:
        source = os.path.join(request.staging_target_path, request.volume_id)
        target = request.target_path
        with self.lock:
            if is_mount_point(target):
                return csi_pb2.NodePublishVolumeResponse()
            if request.volume_capability.HasField("block"):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.close(os.open(target, os.O_CREAT | os.O_RDWR, 0o600))
            else:
                os.makedirs(target, 0o750, exist_ok=True)
            run(["mount", "--bind", source, target])
            if request.readonly:
                run(["mount", "-o", "remount,bind,ro", target])
        log.info("published %s at %s", request.volume_id, target)
        return csi_pb2.NodePublishVolumeResponse()


class Identity(csi_pb2_grpc.IdentityServicer):
    def GetPluginInfo(self, request: csi_pb2.GetPluginInfoRequest,  # noqa: N802
                      context: grpc.ServicerContext) -> csi_pb2.GetPluginInfoResponse:
        return csi_pb2.GetPluginInfoResponse(name=DRIVER, vendor_version="stand-in")

    def GetPluginCapabilities(self, request: csi_pb2.GetPluginCapabilitiesRequest,  # noqa: N802
                              context: grpc.ServicerContext) -> csi_pb2.GetPluginCapabilitiesResponse:
        return csi_pb2.GetPluginCapabilitiesResponse()

    def Probe(self, request: csi_pb2.ProbeRequest, context: grpc.ServicerContext) -> csi_pb2.ProbeResponse:  # noqa: N802
        return csi_pb2.ProbeResponse()


class Registration(reg_grpc.RegistrationServicer):
    def __init__(self, csi_socket: str, marker: Path) -> None:
        self.csi_socket = csi_socket
        self.marker = marker

    def GetInfo(self, request: reg_pb2.InfoRequest, context: grpc.ServicerContext) -> reg_pb2.PluginInfo:  # noqa: N802
        return reg_pb2.PluginInfo(type="CSIPlugin", name=DRIVER, endpoint=self.csi_socket,
                                  supported_versions=["1.0.0"])

    def NotifyRegistrationStatus(self, request: reg_pb2.RegistrationStatus,  # noqa: N802
                                 context: grpc.ServicerContext) -> reg_pb2.RegistrationStatusResponse:
        log.info("registration: %s %s", request.plugin_registered, request.error)
        if request.plugin_registered:
            self.marker.write_text("yes\n")
        return reg_pb2.RegistrationStatusResponse()


def serve(socket: str, add: list[tuple[Callable[[Any, grpc.Server], None], object]]) -> grpc.Server:
    if os.path.lexists(socket):
        os.unlink(socket)
    os.makedirs(os.path.dirname(socket), exist_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    for register, servicer in add:
        register(servicer, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--ceph-conf", required=True, help="a ceph.conf with a client keyring (rbd-fuse)")
    parser.add_argument("--work-dir", required=True, type=Path, help="rbd-fuse mounts and the registered marker")
    parser.add_argument("--kubelet-dir", default="/var/lib/kubelet")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    csi_socket = os.path.join(args.kubelet_dir, "plugins", DRIVER, "csi.sock")
    reg_socket = os.path.join(args.kubelet_dir, "plugins_registry", f"{DRIVER}-reg.sock")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    (args.work_dir / REGISTERED).unlink(missing_ok=True)
    csi = serve(csi_socket, [(csi_pb2_grpc.add_IdentityServicer_to_server, Identity()),
                             (csi_pb2_grpc.add_NodeServicer_to_server,
                              Node(args.node_id, Mapper(args.ceph_conf, args.work_dir)))])
    registration = serve(reg_socket, [(reg_grpc.add_RegistrationServicer_to_server,
                                       Registration(csi_socket, args.work_dir / REGISTERED))])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(1):
        pass
    # As node-driver-registrar on SIGTERM: the socket goes, so the kubelet deregisters the driver.
    registration.stop(0)
    os.unlink(reg_socket)
    csi.stop(2).wait()
    os.unlink(csi_socket)
    log.info("stopped")


if __name__ == "__main__":
    main()
