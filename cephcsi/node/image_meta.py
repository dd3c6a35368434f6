"""An RBD image's metadata (`rbd image-meta list/set`) from the node plugin, which has no librados
connection of its own.

Keys go in 0600 files and values are never logged; a secret value is written with `set_secret`
(`rados setomapval` from stdin into the header's `metadata_<key>`), never on argv, and is read
fresh by each caller. docs/design/node.md, "Image metadata from the node".
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from cephcsi.ceph.credentials import Credentials, key_file
from cephcsi.errors import Internal
from cephcsi.node.exec import CommandFailed, Runner
from cephcsi.node.mappers.rbd_cli import image_args, translate
from cephcsi.node.stage_record import ImageSpec

METADATA_PREFIX = "metadata_"
"""librbd's omap key prefix of an image metadata key in the header object (cls_rbd)."""


@dataclass(frozen=True)
class RbdImageMetadata:
    """The metadata of one image, read and written with the stage's credentials."""

    runner: Runner = field(repr=False)
    timeout: float
    image: ImageSpec
    monitors: str
    credentials: Credentials = field(repr=False)

    def _auth(self, keyfile: str) -> list[str]:
        return ["--id", self.credentials.user_id, "-m", self.monitors, f"--keyfile={keyfile}"]

    def _argv(self, action: str, keyfile: str) -> list[str]:
        return ["rbd", "image-meta", action, *image_args(self.image), "--id", self.credentials.user_id,
                "-m", self.monitors, f"--keyfile={keyfile}"]

    def read(self) -> dict[str, str]:
        """Every key of the image's metadata and its value (one `rbd image-meta list`)."""
        what = f"read the metadata of image {self.image}"
        with key_file(self.credentials) as keyfile:
            try:
                result = self.runner([*self._argv("list", keyfile), "--format", "json"], what=what,
                                     timeout=self.timeout, secrets=(self.credentials.key,))
            except CommandFailed as error:
                raise translate(error, what, self.image) from None
        try:
            doc = json.loads(result.stdout or "{}")
        except ValueError:
            raise Internal(f"`rbd image-meta list` printed something that is not JSON for image {self.image}") from None
        if not isinstance(doc, dict):
            raise Internal(f"`rbd image-meta list` printed no JSON object for image {self.image}")
        return {str(key): str(value) for key, value in doc.items()}

    def set(self, key: str, value: str) -> None:
        """Only for values that are no secret (the encryption state): the value goes into argv."""
        what = f"set metadata {key} of image {self.image}"
        with key_file(self.credentials) as keyfile:
            try:
                self.runner([*self._argv("set", keyfile), key, value], what=what, timeout=self.timeout,
                            secrets=(self.credentials.key,))
            except CommandFailed as error:
                raise translate(error, what, self.image) from None

    def image_id(self) -> str:
        """The image's id (`rbd info`): its header object is rbd_header.<id>."""
        what = f"read the id of image {self.image}"
        with key_file(self.credentials) as keyfile:
            try:
                result = self.runner(["rbd", "info", *image_args(self.image), *self._auth(keyfile), "--format", "json"],
                                     what=what, timeout=self.timeout, secrets=(self.credentials.key,))
            except CommandFailed as error:
                raise translate(error, what, self.image) from None
        try:
            found = json.loads(result.stdout or "{}").get("id")
        except (ValueError, AttributeError):
            found = None
        if not isinstance(found, str) or not found:
            raise Internal(f"`rbd info` printed no image id for image {self.image} (a format 1 image has none; "
                           "encrypted volumes are format 2)")
        return found

    def set_secret(self, key: str, value: str) -> None:
        """Set `key` to a value that must never be in argv: into the header's omap, from stdin."""
        header = f"rbd_header.{self.image_id()}"
        what = f"set metadata {key} of image {self.image}"
        namespace = ["--namespace", self.image.namespace] if self.image.namespace else []
        with key_file(self.credentials) as keyfile:
            try:
                self.runner(["rados", "--pool", self.image.pool, *namespace, *self._auth(keyfile),
                             "setomapval", header, f"{METADATA_PREFIX}{key}"],
                            what=what, timeout=self.timeout, stdin=value, secrets=(self.credentials.key, value))
            except CommandFailed as error:
                raise translate(error, what, self.image) from None
