"""`mapOptions` / `unmapOptions` StorageClass parameters, with ceph-csi's meaning.

Two forms:
  * a plain comma list, `"lock_on_read,queue_depth=1024"`: applies to whichever mapper maps
    the volume;
  * per mapper, `"krbd:lock_on_read,queue_depth=1024;nbd:try-netlink"`: each mapper takes
    its own list (`nbd` names rbd-nbd, as in ceph-csi; `fuse` is accepted for symmetry).
Mixing a plain list with typed lists is refused, as it is ambiguous.
"""
from __future__ import annotations

import re

from cephcsi.errors import InvalidArgument

# mapper name (as in `mounter`) → the prefix ceph-csi uses in mapOptions
PREFIXES = {"krbd": "krbd", "rbd-nbd": "nbd", "fuse": "fuse"}
# Characters an option may contain: they end up in one argv element, but a stray space or
# quote is always a typo worth reporting rather than passing on to the kernel.
_OPTION = re.compile(r"^[A-Za-z0-9_.:/+=@-]+$")


def parse(text: str, mapper: str, parameter: str = "mapOptions") -> list[str]:
    """The options from `text` that apply to `mapper` (krbd | rbd-nbd | fuse)."""
    text = text.strip()
    if not text:
        return []
    plain: list[str] | None = None
    typed: dict[str, list[str]] = {}
    for item in (part.strip() for part in text.split(";")):
        if not item:
            continue
        prefix, sep, rest = item.partition(":")
        if sep and prefix.strip() in PREFIXES.values():
            key = prefix.strip()
            if key in typed:
                raise InvalidArgument(f"{parameter}: {key!r} options appear twice in {text!r}")
            typed[key] = _split(rest, parameter)
        elif sep and "=" not in prefix and "," not in prefix:
            raise InvalidArgument(
                f"{parameter}: unknown mapper type {prefix.strip()!r} in {text!r} "
                f"(use {', '.join(sorted(PREFIXES.values()))})"
            )
        else:
            if plain is not None:
                raise InvalidArgument(f"{parameter}: more than one untyped option list in {text!r}")
            plain = _split(item, parameter)
    if plain is not None and typed:
        raise InvalidArgument(
            f"{parameter}: {text!r} mixes a plain option list with per-mapper lists; use only 'krbd:...;nbd:...'"
        )
    if plain is not None:
        return plain
    return typed.get(PREFIXES[mapper], [])


def _split(text: str, parameter: str) -> list[str]:
    options = [option.strip() for option in text.split(",") if option.strip()]
    for option in options:
        if not _OPTION.match(option):
            raise InvalidArgument(f"{parameter}: option {option!r} contains characters that are not allowed")
    return options


def merge(defaults: list[str], user: list[str]) -> list[str]:
    """User options win over defaults with the same key (`io-timeout=30` replaces `io-timeout=0`)."""
    keys = {option.split("=", 1)[0] for option in user}
    return [option for option in defaults if option.split("=", 1)[0] not in keys] + user
