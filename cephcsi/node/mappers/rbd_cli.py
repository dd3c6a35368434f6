"""Shared logic of the mappers driven by `rbd device map/unmap/list` (krbd and rbd-nbd).

`rbd device list` is the source of truth for what is mapped: a device path from a stage record
is only used after the listing confirms it still maps the same image, because device names are
reused (after a reboot /dev/rbd0 may be another volume's device).
"""
from __future__ import annotations

import json
import logging
import re
import shlex
from collections.abc import Callable, Mapping

from cephcsi.ceph.credentials import key_file
from cephcsi.errors import (
    CephCSIError,
    FailedPrecondition,
    Internal,
    NotFound,
    PermissionDenied,
    Rule,
    Unavailable,
    translate_by,
)
from cephcsi.node.exec import CommandFailed, Runner, tail
from cephcsi.node.mappers import exclusive
from cephcsi.node.mappers.base import MapRequest
from cephcsi.node.mappers.tool_keys import ToolKeys
from cephcsi.node.stage_record import ImageSpec, StageRecord
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

_ERRNO = re.compile(r"\((\d+)\) ")
# What librados prints on every run because no ceph.conf exists: the driver gives the tools
# monitors (-m) and key (--keyfile) on the command line, on purpose (config.json is the one
# source), so these lines say nothing. They came first in stderr and pushed the real cause to
# the end of error messages; "can't open ceph.conf: (2) ..." also fed a false ENOENT to the
# errno matching below. Lines are dropped only for quoting and matching; the debug log of
# each command keeps the raw stderr.
_CONF_NOISE = (
    "did not load config file, using default settings",
    "errors while parsing config file!",
    "can't open ceph.conf",
)


def ceph_stderr(text: str) -> str:
    """A Ceph tool's stderr without blank lines and the ceph.conf noise above."""
    return "\n".join(
        line for line in text.splitlines()
        if line.strip() and not any(noise in line.lower() for noise in _CONF_NOISE)
    )


def said(error: CommandFailed) -> str:
    """What a failed rbd command told the user, without the noise: stderr, after whatever it
    printed on stdout — `rbd device map` prints its advice there, e.g. the kernel's "RBD image
    feature set mismatch. You can disable features unsupported by the kernel with ..." (seen on
    a real kernel, tests/vm), while stderr only says "map failed: (6) No such device or address"."""
    return ceph_stderr(f"{error.result.stdout}\n{error.stderr}")


def failure(error: CommandFailed, what: str) -> str:
    """CommandFailed's message, quoting the command's output without the noise."""
    return f"{what} failed: `{shlex.join(error.result.argv)}` exited {error.returncode}: {tail(said(error))}"


def image_args(image: ImageSpec) -> list[str]:
    """Explicit --pool/--namespace/--image: no parsing of a spec string with odd names."""
    args = ["--pool", image.pool]
    if image.namespace:
        args += ["--namespace", image.namespace]
    return args + ["--image", image.image]


TABLE: tuple[Rule, ...] = (
    Rule(FailedPrecondition, "{what}: this node cannot create the device ({message}); choose another mounter",
         phrases=("failed to load rbd kernel module", "failed to find unused device")),
    # krbd refuses images with features the kernel lacks (journaling; object-map and fast-diff
    # on old kernels) with ENXIO and a hint naming the `rbd feature disable` command.
    Rule(FailedPrecondition, "{what}: this node's kernel RBD client does not support all features of image "
         "{image}; disable them on the image as the message says, or use mounter rbd-nbd ({message})",
         phrases=("feature set mismatch",)),
    # An `exclusive` map (mappers/exclusive.py) while another client holds the image's lock, which
    # refuses to hand it over (EROFS): the volume is written elsewhere.
    Rule(FailedPrecondition, "{what}: another Ceph client holds the exclusive lock of image {image} and keeps it, "
         "so the volume is in use read-write elsewhere (another node, or a hand-run map); `rbd status` and "
         "`rbd lock ls` on the image name that client. Stop it there first ({message})",
         phrases=("failed to acquire exclusive lock", "failed to request exclusive lock")),
    Rule(NotFound, "{what}: image {image} does not exist", errnos=frozenset({2}),
         phrases=("error opening image", "does not exist", "image not found")),
    Rule(PermissionDenied, "{what}: Ceph refused the credentials or their caps: {message}", errnos=frozenset({1, 13})),
    Rule(Unavailable, "{what}: Ceph is unreachable: {message}", errnos=frozenset({110, 111, 113})),
    Rule(FailedPrecondition, "{what}: the device is busy (still mounted, or open in a process on this node); "
         "stop what holds it (`fuser -vm` on the device names it), then retry: {message}", errnos=frozenset({16})),
    Rule(Internal, "{message}"),
)
"""A failed `rbd device map/unmap` by the errnos ("(2) No such file…") and phrases of its output (`said`)."""


def translate(error: CommandFailed, what: str, image: ImageSpec) -> CephCSIError:
    """A failed rbd command → the error class a CO can act on."""
    text = said(error)
    codes = {int(code) for code in _ERRNO.findall(text)}
    found = translate_by(TABLE, codes, text.lower(), what=what, image=image, message=failure(error, what))
    assert found is not None  # the table ends with a fallback row
    return found


class RbdDeviceMapper:
    """`rbd device map --device-type <type>` with --id/-m/--keyfile; subclasses set the type
    and default options."""

    name = ""
    device_type = ""
    image_field = "name"
    """The key of the image name in `rbd device list --format json`: krbd's listing says "name",
    rbd-nbd's (`rbd-nbd list-mapped`, which the listing runs for nbd) says "image"."""

    def __init__(self, runner: Runner, timeout: float, wait_for_device: Callable[[str, float], None], device_timeout: float) -> None:
        self.run = runner
        self.timeout = timeout
        self.wait_for_device = wait_for_device
        self.device_timeout = device_timeout
        self.keys = ToolKeys(runner, timeout)

    def work_dir_for(self, volume_id: str, staging_path: str) -> str:
        return ""

    def map_options(self, request: MapRequest) -> list[str]:
        return list(request.options)

    def unmap_options(self, record: StageRecord) -> list[str]:
        return list(record.unmap_options)

    def extra_map_args(self, request: MapRequest) -> list[str]:
        return []

    exclusive_by_default = False
    """Whether a read-write map of a single-node volume adds the `exclusive` option (see exclusive.py)."""

    def wants_exclusive(self, request: MapRequest) -> bool:
        return self.exclusive_by_default and exclusive.wanted(request.exclusive, request.read_only, request.options)

    def map_argv(self, request: MapRequest, keyfile: str, exclusive_lock: bool = False) -> list[str]:
        argv = ["rbd", "device", "map", "--device-type", self.device_type, *image_args(request.image)]
        argv += ["--id", request.credentials.user_id, "-m", request.monitors, f"--keyfile={keyfile}"]
        argv += self.extra_map_args(request)
        if request.read_only:
            argv.append("--read-only")
        options = self.map_options(request) + ([exclusive.OPTION] if exclusive_lock else [])
        if options:
            argv += ["--options", ",".join(options)]
        return argv

    def image_features(self, request: MapRequest, keyfile: str) -> frozenset[str]:
        """The image's features (`rbd info`): `exclusive` needs exclusive-lock."""
        what = f"read the features of image {request.image}"
        argv = ["rbd", "info", *image_args(request.image), "--id", request.credentials.user_id,
                "-m", request.monitors, f"--keyfile={keyfile}", "--format", "json"]
        try:
            result = self.run(argv, what=what, timeout=self.timeout, secrets=(request.credentials.key,))
        except CommandFailed as error:
            raise translate(error, what, request.image) from None
        try:
            doc = json.loads(result.stdout or "{}")
        except ValueError:
            raise Internal(f"`rbd info` printed something that is not JSON: {result.stdout[:200]!r}") from None
        features = doc.get("features") if isinstance(doc, dict) else None
        return frozenset(str(f) for f in features) if isinstance(features, list) else frozenset()

    def mapped_new(self, request: MapRequest, device: str, options: list[str]) -> None:
        """Called once a map made `device` (not when the image was mapped already)."""

    def unmap_argv(self, record: StageRecord, device: str) -> list[str]:
        argv = ["rbd", "device", "unmap", "--device-type", self.device_type]
        options = self.unmap_options(record)
        if options:
            argv += ["--options", ",".join(options)]
        return argv + [device]

    def mapped(self) -> list[dict[str, str]]:
        what = f"list {self.name} mappings"
        try:
            result = self.run(
                ["rbd", "device", "list", "--device-type", self.device_type, "--format", "json"],
                what=what,
                timeout=self.timeout,
            )
        except CommandFailed as error:
            raise Internal(failure(error, what)) from None
        try:
            entries = json.loads(result.stdout or "[]")
        except ValueError:
            raise Internal(f"`rbd device list` printed something that is not JSON: {result.stdout[:200]!r}") from None
        return [e for e in entries if isinstance(e, dict)]

    def listed_image(self, entry: Mapping[str, object]) -> str:
        """The image of one `mapped()` entry, whichever tool listed it."""
        return str(entry.get(self.image_field) or "")

    def device_of(self, image: ImageSpec) -> str | None:
        for entry in self.mapped():
            if (
                entry.get("pool") == image.pool
                and (entry.get("namespace") or "") == image.namespace
                and self.listed_image(entry) == image.image
                and entry.get("snap") in (None, "", "-")
            ):
                return str(entry.get("device") or "") or None
        return None

    def find(self, record: StageRecord) -> str | None:
        return self.device_of(record.image_spec)

    def map(self, request: MapRequest) -> str:
        existing = self.device_of(request.image)
        if existing:
            log.info("image already mapped", extra=fields(image=str(request.image), device=existing, mapper=self.name))
            return existing
        what = f"map image {request.image} with {self.name}"
        self.keys.check(request.credentials)
        with key_file(request.credentials) as keyfile:
            exclusive_lock = False
            if self.wants_exclusive(request):
                exclusive_lock = exclusive.possible(request, self.image_features(request, keyfile), self.name)
            argv = self.map_argv(request, keyfile, exclusive_lock)
            try:
                result = self.run(argv, what=what, timeout=self.timeout, secrets=(request.credentials.key,))
            except CommandFailed as error:
                raise translate(error, what, request.image) from None
        lines = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("/dev/")]
        if not lines:
            raise Internal(f"{what}: rbd printed no device path (stdout {result.stdout[:200]!r})")
        device = lines[-1]
        self.wait_for_device(device, self.device_timeout)
        options = argv[argv.index("--options") + 1].split(",") if "--options" in argv else []
        log.info("mapped", extra=fields(image=str(request.image), device=device, mapper=self.name,
                                        exclusive=exclusive.OPTION in options))
        self.mapped_new(request, device, options)
        return device

    def unmap(self, record: StageRecord) -> None:
        device = self.find(record)
        if device is None:
            return  # already unmapped (or never mapped): nothing of ours to release
        if record.device and record.device != device:
            log.warning("recorded device differs from the mapping", extra=fields(recorded=record.device, actual=device))
        what = f"unmap {device} ({record.image_spec}) with {self.name}"
        try:
            self.run(self.unmap_argv(record, device), what=what, timeout=self.timeout)
        except CommandFailed as error:
            if self.find(record) is None:
                return  # someone else unmapped it meanwhile
            raise translate(error, what, record.image_spec) from None
        log.info("unmapped", extra=fields(image=str(record.image_spec), device=device, mapper=self.name))
