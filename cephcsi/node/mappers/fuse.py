"""fuse: the userspace mapper — rbd-fuse exposes the image as a file, a loop device makes that
file a block device. For nodes with neither the rbd nor the nbd kernel module.

DANGER: `<state-dir>/fuse/<hash>/mnt/<image>` IS the image (unlink = rbd_remove): work
directories live only under --state-dir and are never removed recursively. Restart behaviour,
the loop's recorded identity and the error `TABLE`: docs/design/node.md, "fuse".
"""
from __future__ import annotations

import errno
import hashlib
import logging
import os
import select
import signal
import time
from collections.abc import Callable

from cephcsi.ceph import cephx_keys
from cephcsi.ceph.credentials import key_file
from cephcsi.errors import (
    CephCSIError,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Rule,
    Unavailable,
    translate_by,
)
from cephcsi.node import mounts
from cephcsi.node.exec import CommandFailed, Runner, tail
from cephcsi.node.mappers import loops
from cephcsi.node.mappers.base import FUSE, MapRequest
from cephcsi.node.mappers.tool_keys import ToolKeys
from cephcsi.node.stage_record import LoopBacking, StageRecord
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

FUSE_SUBDIR = "fuse"
MOUNT_DIR = "mnt"
CONF_NAME = "ceph.conf"
LOG_NAME = "rbd-fuse.log"
KEY_PREFIX = "cephcsi-key-"
_EXIT_WAIT = 10.0
_BUSY_WAIT = 3.0
"""How long the rbd-fuse mount may read busy once its loop devices are detached (`_unmount_fuse`)."""


RBD_FUSE_DEFAULT_POOL = "rbd"
# rbd-fuse options that crash a libfuse3 build (see rbd_fuse_argv), and how that crash exits:
# killed by SIGSEGV/SIGABRT (Ceph's handler re-raises), or 128+signal through a shell.
_CRASH_CODES = frozenset({-11, -6, 139, 134})

TABLE: tuple[Rule, ...] = (
    Rule(PermissionDenied, "{what}: Ceph refused the credentials (wrong userID/userKey?): {stderr}",
         phrases=("handle_auth_bad_method", "(13)", "permission denied")),
    Rule(Unavailable, "{what}: cannot reach the Ceph monitors: {stderr}",
         phrases=("timed out", "(110)", "(111)", "failed to fetch mon config")),
)
"""rbd-fuse failures by the phrases of its stderr; anything else stays the CommandFailed it was."""


def translate(error: CommandFailed, what: str, key: cephx_keys.KeyInfo | None = None) -> CephCSIError:
    """A failed rbd-fuse start → the error class a CO can act on. A refusal or a monitor timeout
    also says what the key's cipher suggests (a Tentacle cluster that allows only aes256k answers
    a right aes key with `handle_auth_bad_method`, the same as a wrong key)."""
    found = translate_by(TABLE, set(), error.stderr.lower(), what=what, stderr=tail(error.stderr, 300))
    if found is None:
        return error
    return type(found)(f"{found.message} {cephx_keys.refusal_hint(key)}") if key is not None else found


def rbd_fuse_argv(conf: str, user_id: str, pool: str, namespace: str, image: str, mount_dir: str) -> list[str]:
    """The rbd-fuse command line. -p is left out for rbd-fuse's own default pool 'rbd'.

    rbd-fuse's option defaults are string literals (pool "rbd", namespace ""), and libfuse3's
    fuse_opt_parse frees a "%s" option's previous value before storing the new one (libfuse2
    did not). So an rbd-fuse built against libfuse3 (Debian 13's Ceph 18.2.7 with libfuse3
    3.17.2) calls free() on a literal and dies of SIGSEGV (-p/--poolname) or SIGABRT
    (-s/--namespace) on every mount that passes a pool or namespace. -c and --id are consumed
    by Ceph's own argument parsing and -r's default is NULL, so those are safe. Without -p
    the argv means the same to every rbd-fuse (Pacific's libfuse2 build included); a
    non-default pool or a namespace still needs the options, which such a build cannot take.
    """
    argv = ["rbd-fuse", "-c", conf, "--id", user_id]
    if pool != RBD_FUSE_DEFAULT_POOL:
        argv += ["-p", pool]
    if namespace:
        argv.append(f"--namespace={namespace}")
    return [*argv, "-r", image, mount_dir]


def _passes_pool_or_namespace(argv: list[str]) -> bool:
    return any(arg in ("-p", "-s") or arg.startswith(("--poolname=", "--namespace=")) for arg in argv)


def backing_file(work_dir: str, image: str) -> str:
    return os.path.join(work_dir, MOUNT_DIR, image)


def fuse_processes(mount_dir: str, proc: str = "/proc") -> list[int]:
    """Live rbd-fuse processes serving `mount_dir`, matched on their argv (a zombie's argv is
    empty, so exited ones drop out: they hold neither the image nor the mount)."""
    pids: list[int] = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "cmdline"), "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"rbd-fuse" and os.fsencode(mount_dir) in argv:
            pids.append(int(entry))
    return pids


def wait_for_exit(pids: list[int], timeout: float) -> None:
    """Return when every pid has exited or after `timeout`. Waits on pidfds, which the kernel
    makes readable at the exit itself: no polling interval is added to every unstage (the
    daemonized rbd-fuse is not our child, so there is no waitpid)."""
    fds: list[int] = []
    try:
        for pid in pids:
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:
                continue  # gone already
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        pending = len(fds)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            ready = poller.poll(left * 1000)
            for fd, _events in ready:
                poller.unregister(fd)
                pending -= 1
    finally:
        for fd in fds:
            os.close(fd)


class FuseMapper:
    name = FUSE

    def __init__(
        self,
        runner: Runner,
        timeout: float,
        state_dir: str,
        connect_timeout: float,
        wait_for_device: Callable[[str, float], None],
        device_timeout: float,
        mounter: mounts.Mounter,
    ) -> None:
        self.run = runner
        self.timeout = timeout
        self.root = os.path.join(state_dir, FUSE_SUBDIR)
        self.connect_timeout = connect_timeout
        self.wait_for_device = wait_for_device
        self.device_timeout = device_timeout
        self.mounter = mounter
        self.keys = ToolKeys(runner, timeout)

    def work_dir_for(self, volume_id: str, staging_path: str) -> str:
        digest = hashlib.sha256(f"{volume_id}\0{staging_path}".encode()).hexdigest()[:24]
        return os.path.join(self.root, digest)

    # -- map -------------------------------------------------------------------------------

    def map(self, request: MapRequest) -> str:
        if not request.work_dir:
            raise Internal("fuse mapper called without a work directory (a bug: record it before mapping)")
        self._prepare_dirs(request.work_dir)
        mount_dir = os.path.join(request.work_dir, MOUNT_DIR)
        backing = backing_file(request.work_dir, request.image.image)
        if not self._fuse_ready(mount_dir, backing, str(request.image)):
            self._start_fuse(request, mount_dir, backing)
        attached = loops.loops_backed_by(backing)
        if attached:
            device = attached[0]
            log.info("loop device already attached", extra=fields(device=device, image=str(request.image)))
        else:
            device = self._attach_loop(backing, request)
        self.wait_for_device(device, self.device_timeout)
        return device

    def _prepare_dirs(self, work_dir: str) -> None:
        try:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            os.makedirs(work_dir, mode=0o700, exist_ok=True)
            os.chmod(work_dir, 0o700)  # makedirs' mode is masked by umask and skipped when it exists
            mount_dir = os.path.join(work_dir, MOUNT_DIR)
            if not mounts.is_mount_point(mount_dir):
                os.makedirs(mount_dir, mode=0o700, exist_ok=True)
        except OSError as error:
            raise Internal(f"cannot create the rbd-fuse work directory {work_dir}: {error.strerror}") from None

    def _fuse_ready(self, mount_dir: str, backing: str, image: str) -> bool:
        """True when a live rbd-fuse for this image is mounted; cleans up a dead one."""
        entry = mounts.top_mount(mount_dir)
        if entry is None:
            return False
        state = mounts.probe_path(backing, self.connect_timeout)
        if state == "ok":
            return True
        log.warning("stale rbd-fuse mount, replacing it", extra=fields(path=mount_dir, state=state, image=image))
        for loop in loops.loops_backed_by(backing):
            self._detach_loop(loop, backing)
        self.mounter.unmount(mount_dir)
        return False

    def _write_conf(self, work_dir: str, monitors: str, keyfile: str) -> str:
        if any(c in monitors for c in "\n\r"):
            raise InvalidArgument("monitor addresses in the cluster config contain a line break")
        conf = os.path.join(work_dir, CONF_NAME)
        text = (
            "[global]\n"
            f"mon host = {monitors}\n"
            f"keyfile = {keyfile}\n"
            # One long-lived daemon per volume: a shared admin socket name would collide.
            "admin socket =\n"
            f"log file = {os.path.join(work_dir, LOG_NAME)}\n"
            f"client mount timeout = {self.connect_timeout:g}\n"
        )
        tmp = conf + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, conf)
        return conf

    def _start_fuse(self, request: MapRequest, mount_dir: str, backing: str) -> None:
        what = f"start rbd-fuse for {request.image}"
        self.keys.check(request.credentials)
        with key_file(request.credentials, directory=request.work_dir) as keyfile:
            conf = self._write_conf(request.work_dir, request.monitors, keyfile)
            argv = rbd_fuse_argv(conf, request.credentials.user_id, request.image.pool, request.image.namespace, request.image.image, mount_dir)
            try:
                self.run(
                    argv,
                    what=what,
                    timeout=self.connect_timeout + 10,
                    new_session=True,
                    secrets=(request.credentials.key,),
                )
            except CommandFailed as error:
                if error.returncode in _CRASH_CODES and _passes_pool_or_namespace(argv):
                    raise FailedPrecondition(
                        f"{what}: rbd-fuse crashed while parsing its options (exit {error.returncode}). This rbd-fuse "
                        "(a libfuse3 build, e.g. Debian 13's Ceph 18.2.7) crashes on every -p/--poolname and "
                        "-s/--namespace option, so it can serve only images in the pool 'rbd' outside any RADOS "
                        f"namespace; {request.image} is not. Use the krbd or rbd-nbd mapper for it. "
                        f"{tail(error.stderr, 200)}"
                    ) from None
                raise translate(error, what, request.credentials.key_info) from None
            # The first request waits for rbd-fuse's FUSE init (its Ceph connection); only then
            # may the key file go.
            state = mounts.probe_path(backing, self.connect_timeout + 5)
        if state == "ok":
            log.info("rbd-fuse mounted", extra=fields(image=str(request.image), path=mount_dir))
            return
        self._stop_fuse(mount_dir)
        if state == "missing":
            raise NotFound(f"image {request.image} does not exist (rbd-fuse found no such image in the pool)")
        raise Unavailable(f"{what}: rbd-fuse did not connect to Ceph ({state}); see {os.path.join(request.work_dir, LOG_NAME)}")

    def _attach_loop(self, backing: str, request: MapRequest) -> str:
        argv = ["losetup", "--find", "--show", "--direct-io=on"]
        if request.read_only:
            argv.append("--read-only")
        result = self.run([*argv, backing], what=f"attach a loop device to {request.image}", timeout=self.timeout)
        device = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
        if not device.startswith("/dev/loop"):
            raise Internal(f"losetup printed no loop device for {request.image} (stdout {result.stdout[:200]!r})")
        log.info("loop device attached", extra=fields(device=device, image=str(request.image)))
        return device

    # -- find / unmap ----------------------------------------------------------------------

    def find(self, record: StageRecord) -> str | None:
        if not record.work_dir:
            return None
        attached = loops.loops_backed_by(backing_file(record.work_dir, record.image))
        return attached[0] if attached else None

    def loop_backing(self, device: str) -> LoopBacking | None:
        """The identity to record for the loop device a stage uses (None: not an attached loop)."""
        status = loops.loop_status(device)
        if status is None:
            # Still recorded by name and sequence number, which is what a dead mount needs.
            backing = self._backing_of(device)
            return LoopBacking(device, loops.loop_diskseq(device), backing) if backing else None
        return status

    def unmap(self, record: StageRecord) -> None:
        work_dir = record.work_dir
        if not work_dir:
            return
        if os.path.dirname(work_dir) != self.root:
            # The record names a directory we would not have made: never clean up outside ours.
            raise Internal(f"stage record names work dir {work_dir} outside {self.root}; inspect it by hand")
        mount_dir = os.path.join(work_dir, MOUNT_DIR)
        # By directory, not by image name: a re-derived record may not know the image.
        for loop, backing in loops.loops_under(mount_dir):
            self._detach_loop(loop, backing)
        self.unmap_recorded_loop(record)
        self._stop_fuse(mount_dir)
        self._remove_work_dir(work_dir)

    def unmap_recorded_loop(self, record: StageRecord) -> None:
        """Detach the loop device the stage recorded, when the kernel still describes it exactly
        as it did then. Needed after a restart without a drain: its backing file then reads
        `/<image>` (the rbd-fuse mount went with the old mount namespace), so the search by
        path under the work dir cannot find it, and it would stay attached forever."""
        recorded = record.loop
        if recorded is None:
            return
        backing = self._backing_of(recorded.device)
        state = loops.recorded_loop_state(recorded, backing, record.image)
        if state == "gone":
            return  # detached already (by the search by path, or by hand)
        if state == "other":
            log.info("recorded loop device now serves another file; left alone", extra=fields(device=recorded.device, backing=backing))
            return
        if state == "unknown":
            log.warning(
                "cannot tell whether the recorded loop device still belongs to this volume (the kernel has no "
                "diskseq and its backing file is unreachable); left attached",
                extra=fields(
                    device=recorded.device, backing=backing, volume_id=record.volume_id,
                    action=f"if nothing mounts {recorded.device}, detach it by hand: losetup -d {recorded.device}",
                ),
            )
            return
        log.warning(
            "loop device of this volume lost its rbd-fuse mount (plugin restarted without unstaging?); detaching it",
            extra=fields(device=recorded.device, backing=backing, work_dir=record.work_dir),
        )
        self._detach_loop(recorded.device, backing or "")

    def _detach_loop(self, device: str, backing: str) -> None:
        try:
            self.run(["losetup", "--detach", device], what=f"detach loop device {device}", timeout=self.timeout)
        except CommandFailed:
            if self._backing_of(device) != backing:
                return  # already detached (or the name now belongs to another file: not ours)
            raise
        # The kernel defers the detach (autoclear) while something still holds the device open.
        deadline = time.monotonic() + 5
        while self._backing_of(device) == backing:
            if time.monotonic() >= deadline:
                raise FailedPrecondition(
                    f"loop device {device} for {backing} is still in use (mounted or open elsewhere); "
                    "release it and retry"
                )
            time.sleep(0.01)
        log.info("loop device detached", extra=fields(device=device))

    @staticmethod
    def _backing_of(device: str) -> str | None:
        name = os.path.basename(device)
        try:
            with open(os.path.join(loops.SYS_BLOCK, name, "loop", "backing_file"), encoding="utf-8", errors="replace") as fh:
                return fh.read().rstrip("\n").removesuffix(" (deleted)")
        except OSError:
            return None

    def _stop_fuse(self, mount_dir: str) -> None:
        """Unmount rbd-fuse (which makes it close the image and exit) and wait for the exit, so
        its watch on the image is gone when unstage returns."""
        self._unmount_fuse(mount_dir)
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            # Re-scanned each time: a pid is only signalled while it is still OUR rbd-fuse.
            pids = fuse_processes(mount_dir)
            if not pids:
                return
            if sig is not None:
                for pid in pids:
                    log.warning("rbd-fuse did not exit after unmount", extra=fields(pid=pid, path=mount_dir, signal=sig.name))
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
            wait_for_exit(pids, _EXIT_WAIT if sig is None else 3.0)

    def _unmount_fuse(self, mount_dir: str) -> None:
        """The kernel can still hold a just-detached loop device's backing file for a moment after
        sysfs stops showing it (the last reference goes in a deferred put), and a process orphaned
        by a killed plugin (a `losetup` that opened the file) lets go of it on its own; either makes
        the rbd-fuse mount read busy briefly. So a busy unmount is tried again for a few seconds
        before it stands as the answer."""
        deadline = time.monotonic() + _BUSY_WAIT
        while True:
            try:
                self.mounter.unmount(mount_dir)
                return
            except FailedPrecondition:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.02)

    def _remove_work_dir(self, work_dir: str) -> None:
        """Remove only what we put there; rmdir (never rmtree) keeps any surprise intact."""
        mount_dir = os.path.join(work_dir, MOUNT_DIR)
        if mounts.is_mount_point(mount_dir):
            raise Internal(f"{mount_dir} is still mounted; refusing to remove the work directory")
        try:
            names = os.listdir(work_dir)
        except FileNotFoundError:
            return
        for name in names:
            if name in (CONF_NAME, CONF_NAME + ".tmp", LOG_NAME) or name.startswith(KEY_PREFIX):
                _unlink(os.path.join(work_dir, name))
        for path in (mount_dir, work_dir):
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError as error:
                if error.errno == errno.ENOTEMPTY:
                    log.warning("work directory not empty, left in place", extra=fields(path=path))
                    return
                raise Internal(f"cannot remove {path}: {error.strerror}") from None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
