"""The Kubernetes disk of a VM node: the kubelet binary and a containerd root holding the node's
images (the static pause image and the project's image, under the names the kubelet asks for),
as a raw ext4 image attached as /dev/vdb and mounted at GUEST_ROOT (tests/vm/kube_node.py).

Why a disk of its own, filled on the host: the VM image (build_image.sh) changes rarely, the
project's image with every change to the driver, and importing its 675 MB inside the guest
means hashing and unpacking it on an emulated CPU. Here a throw-away containerd on the host
imports the archives into a folder (the layout the guest's containerd then uses as its root:
content store and overlayfs snapshots hold no absolute paths) and `mkfs.ext4 -d` turns the folder
into a disk, without a loop device. The disk is cached under $CACHE/vm/kube-<key>/, <key>
hashing this file, the kubelet, the pause archive and the project's archive, and attached with
`snapshot=on` like the root disk, so every boot starts from the same images.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.e2e.containerd import Containerd
from tests.e2e.env import IMAGE, image_to_tag

GUEST_ROOT = Path("/var/lib/cephcsi-kube")
"""Where the guest mounts the disk; the containerd of the guest lives under it (see Containerd's
layout: containerd/root, containerd/state, cni/...)."""
GUEST_KUBELET = GUEST_ROOT / "bin" / "kubelet"
DISK_NAME = "kube.raw"
FREE_MB = 1536
"""Room left on the disk for the containers' writable layers, logs and the kubelet's files."""


def cache_dir() -> Path:
    root = os.environ.get("CEPHCSI_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cephcsi")
    return Path(root) / "vm"


def disk_key(kubelet: Path, pause_tar: Path, image_tar: Path) -> str:
    digest = hashlib.sha256()
    digest.update(Path(__file__).read_bytes())
    for path in (kubelet, pause_tar, image_tar):
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def _in_use(folder: Path) -> bool:
    """A process (a running qemu of another test session) names a file of `folder`."""
    wanted = f"{folder}/".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if wanted in (entry / "cmdline").read_bytes():
                    return True
            except OSError:
                continue
    return False


def build(kubelet: Path, pause_tar: Path, image_tar: Path) -> Path:
    """The disk for these binaries and archives (built once, then cached); its path."""
    vm_cache = cache_dir()
    out = vm_cache / f"kube-{disk_key(kubelet, pause_tar, image_tar)}"
    disk = out / DISK_NAME
    if disk.is_file():
        return disk
    vm_cache.mkdir(parents=True, exist_ok=True)
    with open(vm_cache / ".kube-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building the same disk
        if disk.is_file():
            return disk
        work = Path(tempfile.mkdtemp(prefix=".kube-build-", dir=vm_cache))
        try:
            _fill(work, kubelet, pause_tar, image_tar)
            staged = work / "out"
            staged.mkdir()
            used_mb = int(subprocess.run(["du", "-sm", str(work / "disk")], capture_output=True, text=True,
                                         check=True, timeout=300).stdout.split()[0])
            subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "cephcsi-kube", "-E", "lazy_itable_init=1",
                            "-d", str(work / "disk"), str(staged / DISK_NAME), f"{used_mb * 5 // 4 + FREE_MB}M"],
                           capture_output=True, text=True, check=True, timeout=900)
            staged.rename(out)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for old in vm_cache.glob("kube-*"):
            if old != out and not _in_use(old):
                shutil.rmtree(old, ignore_errors=True)
    return disk


def _fill(work: Path, kubelet: Path, pause_tar: Path, image_tar: Path) -> None:
    """work/disk: bin/kubelet and containerd/root with the images imported and named."""
    containerd = Containerd(work_dir=work, log_path=work / "containerd.log", cni_bridge="unused",
                            pod_subnet="10.255.255.0/30", start_timeout=60)
    containerd.start()
    try:
        names = containerd.import_images([pause_tar, image_tar])
        untagged = image_to_tag(names)
        if untagged:
            containerd.tag_image(untagged, IMAGE)
    finally:
        containerd.stop()
    disk = work / "disk"
    (disk / "bin").mkdir(parents=True)
    shutil.copy2(kubelet, disk / "bin" / "kubelet")
    (disk / "containerd").mkdir()
    (work / "containerd" / "root").rename(disk / "containerd" / "root")
