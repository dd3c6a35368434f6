"""Host-level changes the e2e node makes, recorded so that teardown can undo exactly them.

The kubelet and containerd are not containerised here: they change the machine (sysctls,
network links, iptables, mounts, cgroups, directories). Each change goes through `HostChanges`,
which remembers what it found before, and `restore()` undoes the changes in reverse order, every
step best-effort (one failure is logged and the next step still runs) so one stuck mount never
leaves the rest behind.

Inspection helpers (mounts, loop devices, rbd-fuse processes under a path) are used both by the
teardown and by the scenarios' "nothing left" assertions. They parse /proc and `losetup -J`
directly rather than importing the driver's own parsers: a test should not trust the code it
tests to report that code's leaks.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

# Sysctls the kubelet sets at start (pkg/kubelet/cm setupNode) when protectKernelDefaults is off.
KUBELET_SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)


def run(argv: list[str], *, check: bool = True, timeout: float = 60.0, input_text: str | None = None) -> str:
    """Run a host command; its stdout. Errors carry stderr (no secrets ever go through here)."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, input=input_text)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc.stdout


# ---- inspection ---------------------------------------------------------------------------------


def _unescape(field_: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    return field_.encode().decode("unicode_escape") if "\\" in field_ else field_


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo (only what the harness needs)."""

    mount_id: int
    mount_point: str
    fstype: str
    source: str
    optional: str


def mounts() -> list[Mount]:
    """Every mount of this mount namespace, in mount order."""
    found: list[Mount] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        found.append(Mount(int(parts[0]), _unescape(parts[4]), rparts[0], _unescape(rparts[1]) if len(rparts) > 1 else "",
                           " ".join(parts[6:])))
    return found


def _under(path: str, root: str) -> bool:
    root = root.rstrip("/")
    return path == root or path.startswith(root + "/")


def mounts_under(root: str) -> list[Mount]:
    """Mounts at or below root (root itself included)."""
    return [m for m in mounts() if _under(m.mount_point, root)]


def loop_devices() -> list[tuple[str, str]]:
    """(device, backing file) of every attached loop device."""
    out = run(["losetup", "-J", "--list", "-O", "NAME,BACK-FILE"], check=False)
    if not out.strip():
        return []
    return [(d["name"], d.get("back-file") or "") for d in json.loads(out).get("loopdevices", [])]


def loops_under(root: str) -> list[str]:
    """Loop devices whose backing file lies below root."""
    return [dev for dev, back in loop_devices() if _under(back.removesuffix(" (deleted)"), root)]


def processes() -> list[tuple[int, list[str]]]:
    """(pid, argv) of every live process (zombies have an empty argv and are skipped)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if args:
            found.append((int(entry), args))
    return found


def fuse_daemons_under(root: str) -> list[int]:
    """Live rbd-fuse processes whose argv names a path below root (their mount point)."""
    return [pid for pid, argv in processes()
            if os.path.basename(argv[0]) == "rbd-fuse" and any(_under(a, root) for a in argv[1:])]


def wait_until(what: str, check: Callable[[], object], timeout: float, interval: float = 0.25) -> object:
    """Poll check() until truthy; its value. TimeoutError names `what` and the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last: {value!r})")
        time.sleep(interval)


# ---- changes and their undo ---------------------------------------------------------------------


@dataclass
class HostChanges:
    """An undo log of host changes; `restore()` replays it backwards."""

    _undo: list[tuple[str, Callable[[], None]]] = field(default_factory=list)

    def on_restore(self, what: str, undo: Callable[[], None]) -> None:
        """Register an undo step (runs in reverse registration order)."""
        self._undo.append((what, undo))

    def restore(self) -> list[str]:
        """Undo everything; the list of steps that failed (also logged)."""
        failed = []
        while self._undo:
            what, undo = self._undo.pop()
            try:
                undo()
            except Exception as error:  # noqa: BLE001 - teardown must go on
                log.warning("e2e teardown: %s failed: %s", what, error)
                failed.append(f"{what}: {error}")
        return failed

    # -- sysctls --

    def save_sysctls(self, names: Iterable[str]) -> None:
        """Remember the current values; restore() writes them back (the kubelet changes them)."""
        saved: dict[str, str] = {}
        for name in names:
            path = Path("/proc/sys") / name.replace(".", "/")
            try:
                saved[name] = path.read_text().strip()
            except OSError:
                continue

        def undo() -> None:
            for name, value in saved.items():
                path = Path("/proc/sys") / name.replace(".", "/")
                if path.read_text().strip() != value:
                    path.write_text(value)
        self.on_restore("restore sysctls", undo)

    # -- directories --

    def ensure_dir(self, path: Path, *, remove_if_created: bool = True) -> None:
        """Create path (and parents) if missing; restore() removes it again if we made it, but
        only once nothing is mounted below it (a recursive delete through a live rbd-fuse mount
        would unlink the image file, which deletes the RBD image)."""
        if path.exists():
            return
        path.mkdir(parents=True)
        if remove_if_created:
            self.on_restore(f"remove {path}", lambda: remove_tree(path))

    def make_rshared(self, path: Path) -> None:
        """Bind-mount path on itself and make it rshared, so Bidirectional hostPath mounts of it
        propagate back to the host (`/` is a private mount here). Undone by an unmount."""
        if any(m.mount_point == str(path) for m in mounts()):
            run(["mount", "--make-rshared", str(path)])
            return
        run(["mount", "--bind", str(path), str(path)])
        run(["mount", "--make-rshared", str(path)])
        self.on_restore(f"unmount the shared bind of {path}", lambda: unmount_tree(str(path)))

    # -- network --

    def add_address_bridge(self, name: str, address: str) -> None:
        """An address-only bridge holding the node IP (this kernel has no `dummy` netdev)."""
        if run(["ip", "-o", "link", "show", name], check=False).strip():
            run(["ip", "link", "del", name], check=False)
        run(["ip", "link", "add", name, "type", "bridge"])
        self.on_restore(f"delete link {name}", lambda: delete_link(name))
        run(["ip", "addr", "add", f"{address}/32", "dev", name])
        run(["ip", "link", "set", name, "up"])

    def remove_link_at_end(self, name: str) -> None:
        """A link someone else (the CNI bridge plugin) creates; deleted on restore."""
        self.on_restore(f"delete link {name}", lambda: delete_link(name))

    def nat_chain(self, chain: str, rules: list[list[str]], hooks: Iterable[str]) -> None:
        """A private nat chain with `rules`, jumped to from the given built-in chains."""
        self._drop_nat_chain(chain, hooks)
        run(["iptables", "-t", "nat", "-N", chain])
        hooks = list(hooks)
        self.on_restore(f"remove iptables chain {chain}", lambda: self._drop_nat_chain(chain, hooks))
        for rule in rules:
            run(["iptables", "-t", "nat", "-A", chain, *rule])
        for hook in hooks:
            run(["iptables", "-t", "nat", "-I", hook, "-j", chain])

    @staticmethod
    def _drop_nat_chain(chain: str, hooks: Iterable[str]) -> None:
        for hook in hooks:
            while subprocess.run(["iptables", "-t", "nat", "-D", hook, "-j", chain],
                                 capture_output=True, check=False).returncode == 0:
                pass
        subprocess.run(["iptables", "-t", "nat", "-F", chain], capture_output=True, check=False)
        subprocess.run(["iptables", "-t", "nat", "-X", chain], capture_output=True, check=False)

    def remove_new_kube_chains(self) -> None:
        """The kubelet creates KUBE-* canary/firewall chains; remove those that were not there
        before (other users' chains are left alone)."""
        before = {tool: _kube_chains(tool) for tool in ("iptables", "ip6tables")}

        def undo() -> None:
            for tool, old in before.items():
                for table, chain in sorted(_kube_chains(tool) - old):
                    # Rules in built-in chains that jump to it go first.
                    for line in run([tool, "-t", table, "-S"], check=False).splitlines():
                        if f"-j {chain}" in line and line.startswith("-A "):
                            run([tool, "-t", table, *("-D " + line[3:]).split()], check=False)
                for table, chain in sorted(_kube_chains(tool) - old):
                    run([tool, "-t", table, "-F", chain], check=False)
                for table, chain in sorted(_kube_chains(tool) - old):
                    run([tool, "-t", table, "-X", chain], check=False)
        self.on_restore("remove the kubelet's iptables chains", undo)

    def remove_new_netns(self) -> None:
        """containerd names pod network namespaces /run/netns/cni-*; remove the ones it leaves."""
        before = set(_netns_names())

        def undo() -> None:
            for name in sorted(set(_netns_names()) - before):
                if name.startswith("cni-"):
                    run(["ip", "netns", "delete", name], check=False)
        self.on_restore("remove leftover pod network namespaces", undo)


def _kube_chains(tool: str) -> set[tuple[str, str]]:
    found = set()
    for table in ("filter", "nat", "mangle"):
        out = subprocess.run([tool, "-t", table, "-S"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("-N KUBE-"):
                found.add((table, line.split()[1]))
    return found


def _netns_names() -> list[str]:
    try:
        return os.listdir("/run/netns")
    except OSError:
        return []


def delete_link(name: str) -> None:
    if run(["ip", "-o", "link", "show", name], check=False).strip():
        run(["ip", "link", "del", name])


# ---- mounts, loop devices, rbd-fuse -------------------------------------------------------------


def unmount_tree(root: str) -> None:
    """Unmount everything at or below root, deepest (most recent) first. A busy mount is
    lazily detached as a last resort, with a warning: teardown must not leave the host
    half-mounted, but the warning tells that something still held it."""
    for _ in range(5):
        found = mounts_under(root)
        if not found:
            return
        for mount in sorted(found, key=lambda m: (m.mount_point.count("/"), m.mount_id), reverse=True):
            if subprocess.run(["umount", mount.mount_point], capture_output=True, check=False).returncode != 0:
                if subprocess.run(["umount", mount.mount_point], capture_output=True, check=False).returncode != 0:
                    log.warning("e2e teardown: %s busy; detaching it lazily", mount.mount_point)
                    subprocess.run(["umount", "-l", mount.mount_point], capture_output=True, check=False)
    left = mounts_under(root)
    if left:
        raise RuntimeError(f"still mounted under {root}: {[m.mount_point for m in left]}")


def release_data_path(root: str) -> None:
    """Undo the node plugin's rbd-fuse data path under root: filesystems and binds, then loop
    devices backed by rbd-fuse files, then the rbd-fuse mounts and daemons. This order matters:
    a loop device keeps its rbd-fuse file open, and the filesystem keeps the loop device busy."""
    for mount in sorted(mounts_under(root), key=lambda m: m.mount_id, reverse=True):
        if not mount.fstype.startswith("fuse"):
            subprocess.run(["umount", mount.mount_point], capture_output=True, check=False)
    for device in loops_under(root):
        subprocess.run(["losetup", "-d", device], capture_output=True, check=False)
    unmount_tree(root)
    for pid in fuse_daemons_under(root):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def remove_tree(path: Path) -> None:
    """rm -r, refusing while anything is mounted below (see HostChanges.ensure_dir)."""
    if not path.exists():
        return
    left = mounts_under(str(path))
    if left:
        raise RuntimeError(f"not removing {path}: still mounted {[m.mount_point for m in left]}")
    shutil.rmtree(path, ignore_errors=True)


def remove_cgroups(relative: str) -> None:
    """rmdir the cgroup `relative` (e.g. "kubepods") and its children in every v1 hierarchy,
    deepest first. Only empty cgroups can be removed: run after every container is gone."""
    base = Path("/sys/fs/cgroup")
    for hierarchy in base.iterdir():
        top = hierarchy / relative
        if not top.is_dir():
            continue
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda e: e[0].count("/"), reverse=True):
            try:
                os.rmdir(dirpath)
            except OSError as error:
                log.warning("e2e teardown: cannot remove cgroup %s: %s", dirpath, error)
