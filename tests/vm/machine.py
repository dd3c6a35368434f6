"""A real-kernel test node: a Debian VM under qemu, driven through a 9p control share.

`VmNode(index)` has its own tap device, MAC, address (network.py), work folder and control
share; several can run at once on the one bridge, and any of them can be powered off hard
(SIGKILL of qemu: the guest gets no chance to flush or unmap, as a node losing power) or shut
down cleanly. Each boot starts from the pristine image (`snapshot=on`: writes go to a
throw-away overlay).

Control: the image's runner service (tests/vm/guest/runner.py) executes the scripts `run`
drops in the share and writes back exit status, stdout and stderr; no ssh, no guest agent.
The repository is shared read-only at the same path, so the guest runs the driver from the
working tree with the image's venv (/opt/cephcsi/venv: the driver's dependencies and Debian's
rados/rbd bindings).

Accelerator: KVM only where the CPU really offers VT-x/AMD-V (vmx/svm in /proc/cpuinfo);
these machines' /dev/kvm is PVM, under which a stock kernel does not boot, so they use TCG
with `-cpu qemu64` (cheaper to emulate than `-cpu max`). Timeouts scale with the host's load:
under TCG the guest is slowed down by every other process on the host.
"""
from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from typing import IO

from tests.vm import network

QEMU = "qemu-system-x86_64"
GUEST_VENV_PYTHON = "/opt/cephcsi/venv/bin/python"
SHARE_IN_GUEST = "/run/vmctl"
_CPUINFO = "/proc/cpuinfo"


class VmError(RuntimeError):
    """The VM did not boot, died, or did not answer in time."""


class IndexInUse(VmError):
    """Another test session on this machine runs node N (its tap and address)."""


def accelerator() -> str:
    """kvm where the CPU has vmx/svm (and /dev/kvm exists), tcg otherwise; CEPHCSI_VM_ACCEL overrides."""
    forced = os.environ.get("CEPHCSI_VM_ACCEL", "").strip().lower()
    if forced in ("kvm", "tcg"):
        return forced
    try:
        with open(_CPUINFO, encoding="ascii", errors="replace") as handle:
            flags = next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), [])
    except OSError:
        flags = []
    return "kvm" if os.path.exists("/dev/kvm") and ("vmx" in flags or "svm" in flags) else "tcg"


def load_factor() -> float:
    """How much slower than an idle host things run now: 1 at rest, up to 4 under heavy load."""
    per_cpu = os.getloadavg()[0] / (os.cpu_count() or 1)
    return max(1.0, min(4.0, 0.5 + per_cpu))


def scaled(seconds: float) -> float:
    return seconds * load_factor()


@dataclass(frozen=True)
class VmImage:
    folder: str

    @property
    def rootfs(self) -> str:
        return os.path.join(self.folder, "rootfs.raw")

    @property
    def kernel(self) -> str:
        return os.path.join(self.folder, "vmlinuz")

    @property
    def initrd(self) -> str:
        return os.path.join(self.folder, "initrd.img")

    def complete(self) -> bool:
        return all(os.path.isfile(path) for path in (self.rootfs, self.kernel, self.initrd))


@dataclass(frozen=True)
class Result:
    rc: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.rc == 0


class VmNode:
    def __init__(self, image: VmImage, index: int, workdir: str, repo: str, memory_mb: int = 2048,
                 disks: tuple[str, ...] = ()) -> None:
        """`disks`: more raw disk images, /dev/vdb, /dev/vdc... in the guest (also `snapshot=on`)."""
        self.image = image
        self.disks = disks
        self.index = index
        self.workdir = workdir
        self.repo = repo
        self.memory_mb = memory_mb
        self.address = network.guest_address(index)
        self.mac = network.guest_mac(index)
        self.tap = network.tap_name(index)
        self.hostname = f"vm-node-{index}"
        self.accel = accelerator()
        self.share = os.path.join(workdir, "ctl")
        self.console_path = os.path.join(workdir, "console.log")
        self.process: subprocess.Popen[bytes] | None = None
        self.boot_seconds = 0.0
        self._lock: IO[str] | None = None

    # -- lifetime --------------------------------------------------------------------------

    def argv(self) -> list[str]:
        cmdline = " ".join([
            "console=ttyS0", "root=/dev/vda", "rootfstype=ext4", "rw", "net.ifnames=0", "quiet", "loglevel=4",
            "panic=-1", "mitigations=off", "systemd.show_status=false",
            f"cephcsi.ip={self.address}/{network.NETWORK.prefixlen}", f"cephcsi.hostname={self.hostname}",
        ])
        cpu = ["-cpu", "host"] if self.accel == "kvm" else ["-cpu", "qemu64"]
        return [
            QEMU, "-name", f"cephcsi-vm-{self.index}", "-machine", "q35", "-accel", self.accel, *cpu,
            "-smp", "1", "-m", str(self.memory_mb),
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-serial", f"file:{self.console_path}",
            "-kernel", self.image.kernel, "-initrd", self.image.initrd, "-append", cmdline,
            *(arg for path in (self.image.rootfs, *self.disks)
              for arg in ("-drive", f"file={path},if=virtio,format=raw,snapshot=on,cache=unsafe")),
            "-netdev", f"tap,id=net0,ifname={self.tap},script=no,downscript=no",
            "-device", f"virtio-net-pci,netdev=net0,mac={self.mac}",
            "-device", "virtio-rng-pci",
            "-virtfs", f"local,path={self.share},mount_tag=vmctl,security_model=passthrough,id=vmctl",
            "-virtfs", f"local,path={self.repo},mount_tag=repo,security_model=passthrough,readonly=on,id=repo",
        ]

    def start(self, timeout: float = 200) -> None:
        """Boot and wait for the runner; the repository is mounted at its host path."""
        self._take_index()
        network.ensure_bridge()
        network.ensure_tap(self.index)
        shutil.rmtree(self.share, ignore_errors=True)
        os.makedirs(self.share)
        started = time.monotonic()
        log = open(os.path.join(self.workdir, "qemu.log"), "ab")
        try:
            self.process = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        ready = os.path.join(self.share, "ready")
        budget = min(scaled(timeout), 480.0)  # measured: 25 s idle, 140 s at load 5-10 on 2 cores
        deadline = started + budget
        while not os.path.exists(ready):
            if self.process.poll() is not None:
                raise VmError(f"qemu exited with {self.process.returncode} while booting:\n{self.diagnostics()}")
            if time.monotonic() > deadline:
                self.power_off_hard()
                raise VmError(f"VM {self.index} did not start its runner within {budget:.0f}s:\n{self.diagnostics()}")
            time.sleep(0.2)
        self.boot_seconds = time.monotonic() - started
        addresses = self.run("ip -4 -o addr show dev eth0", timeout=30).stdout
        if f" {self.address}/" not in addresses:
            status = self.run("systemctl status --no-pager cephcsi-vm-net; journalctl -b --no-pager -u cephcsi-vm-net",
                              timeout=60)
            raise VmError(f"VM {self.index} is up but eth0 has no {self.address} ({addresses.strip()!r}):\n"
                          f"{status.stdout[-3000:]}")
        repo = shlex.quote(self.repo)
        self.check(
            f"mkdir -p {repo} && mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 repo {repo}",
            timeout=60,
        )

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def power_off_hard(self) -> None:
        """Pull the plug: qemu is killed, the guest flushes and unmaps nothing."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)
        self._release()

    def stop(self, timeout: float = 60) -> None:
        """A clean shutdown (systemd poweroff); a hard one if the guest does not go in time."""
        if self.running():
            try:
                self.run("systemctl --no-block poweroff", timeout=20)
            except VmError:
                pass
            assert self.process is not None
            try:
                self.process.wait(timeout=scaled(timeout))
            except subprocess.TimeoutExpired:
                pass
        self.power_off_hard()

    def _take_index(self) -> None:
        # Two test sessions on one machine must not both use node N's tap and address.
        os.makedirs("/run/cephcsi-vm", exist_ok=True)
        handle = open(f"/run/cephcsi-vm/node-{self.index}.lock", "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise IndexInUse(f"VM node {self.index} is in use by another test session on this machine") from None
        self._lock = handle

    def _release(self) -> None:
        # Only while this node holds its index: once released, the index (and a tap of that
        # name) may belong to another session's VM, whose tap a second stop() must not delete.
        if self._lock is not None:
            network.remove_tap(self.index)
            self._lock.close()
            self._lock = None

    # -- commands --------------------------------------------------------------------------

    def run(self, script: str, timeout: float = 120) -> Result:
        """Run a bash script in the guest as root; its exit status and output."""
        if not self.running():
            raise VmError(f"VM {self.index} is not running:\n{self.diagnostics()}")
        request_id = uuid.uuid4().hex
        budget = scaled(timeout)
        inbox = os.path.join(self.share, "in")
        tmp = os.path.join(inbox, f".{request_id}.tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump({"script": script, "timeout": budget}, handle)
        os.rename(tmp, os.path.join(inbox, f"{request_id}.json"))
        answer = os.path.join(self.share, "out", f"{request_id}.json")
        # The runner kills the script after `budget`; the margin covers a slow 9p round trip.
        deadline = time.monotonic() + budget + scaled(30)
        delay = 0.02
        while not os.path.exists(answer):
            if not self.running():
                raise VmError(f"VM {self.index} died while running {script[:200]!r}:\n{self.diagnostics()}")
            if time.monotonic() > deadline:
                raise VmError(f"VM {self.index}: no answer to {script[:200]!r} within {budget:.0f}s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.2)
        with open(answer, encoding="utf-8") as handle:
            data = json.load(handle)
        os.unlink(answer)
        return Result(int(data["rc"]), str(data["stdout"]), str(data["stderr"]), float(data["seconds"]))

    def check(self, script: str, timeout: float = 120) -> str:
        """`run`, failing unless the script exits 0; its stdout."""
        result = self.run(script, timeout)
        if not result.ok:
            raise VmError(f"VM {self.index}: {script[:300]!r} exited {result.rc}\nstdout: {result.stdout[-2000:]}\n"
                          f"stderr: {result.stderr[-2000:]}")
        return result.stdout

    def spawn(self, script: str, name: str) -> int:
        """Start `script` in the background (its own session); output to `guest_log(name)`. Its pid."""
        log = self.guest_path(f"{name}.log")
        out = self.check(f"setsid bash -c {shlex.quote(script)} >{shlex.quote(log)} 2>&1 </dev/null & echo $!", timeout=30)
        return int(out.strip())

    # -- files in the control share --------------------------------------------------------

    def host_path(self, name: str) -> str:
        """A file in the control share as the host sees it."""
        folder = os.path.join(self.share, "files")
        os.makedirs(folder, exist_ok=True)
        return os.path.join(folder, name)

    def guest_path(self, name: str) -> str:
        """The same file as the guest sees it."""
        self.host_path(name)
        return f"{SHARE_IN_GUEST}/files/{name}"

    def read_file(self, name: str) -> str:
        try:
            with open(self.host_path(name), encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except FileNotFoundError:
            return ""

    def diagnostics(self, lines: int = 60) -> str:
        parts = []
        for name in ("qemu.log", "console.log"):
            try:
                with open(os.path.join(self.workdir, name), encoding="utf-8", errors="replace") as handle:
                    text = handle.read().splitlines()[-lines:]
                parts.append(f"--- {name} (last {lines} lines)\n" + "\n".join(text))
            except FileNotFoundError:
                pass
        return "\n".join(parts)
