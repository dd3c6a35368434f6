"""Read affinity for krbd: the node's CRUSH location from its labels, and the map options.

`read_from_replica=localize,crush_location=<type>:<value>|…` from config.json's
`readAffinity.crushLocationLabels`, in the configured label order; left out when the
StorageClass's mapOptions set either key. Only krbd gets them. docs/design/node.md.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

# Keys whose presence in the user's mapOptions means the user decides read placement alone.
USER_KEYS = frozenset({"read_from_replica", "crush_location"})

CrushLocation = tuple[tuple[str, str], ...]


def crush_type(label: str) -> str:
    """The CRUSH bucket type a Node label key stands for."""
    name = label.partition("/")[2] if "/" in label else label
    name = name.strip()
    return "host" if name == "hostname" else name


def crush_location(labels: Sequence[str], node_labels: Mapping[str, str]) -> CrushLocation:
    """(type, value) pairs for the labels this node carries, in `labels` order."""
    location: dict[str, str] = {}
    for label in labels:
        value = (node_labels.get(label) or "").strip()
        kind = crush_type(label)
        if not value or not kind or kind in location:
            continue  # an empty value would make an invalid crush_location
        location[kind] = value.replace(".", "-")
    return tuple(location.items())


def user_decides(user_options: Sequence[str]) -> bool:
    """The StorageClass's mapOptions already set read placement: never add to or override it."""
    return any(option.split("=", 1)[0] in USER_KEYS for option in user_options)


def map_options(location: CrushLocation, user_options: Sequence[str] = ()) -> list[str]:
    """The krbd options for this location ([] without one, or when the user set their own)."""
    if not location or user_decides(user_options):
        return []
    where = "|".join(f"{kind}:{value}" for kind, value in location)
    return ["read_from_replica=localize", f"crush_location={where}"]
