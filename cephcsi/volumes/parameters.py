"""StorageClass parameters of an RBD volume: parsed once, validated with messages that name the
parameter (unknown keys refused), and turned into the volume context the node plugin needs. Design:
docs/design/controller.md.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from cephcsi.encryption import spec as encryption
from cephcsi.volumes import qos, topology
from cephcsi.encryption.spec import EncryptionSpec
from cephcsi.errors import InvalidArgument

DEFAULT_FEATURES = ("layering",)
DEFAULT_PREFIX = "csi-vol-"
KNOWN_FEATURES = ("layering", "exclusive-lock", "object-map", "fast-diff", "deep-flatten", "journaling")
FEATURE_NEEDS = {
    "object-map": "exclusive-lock",
    "fast-diff": "object-map",
    "journaling": "exclusive-lock",
}
KUBERNETES_PREFIX = "csi.storage.k8s.io/"
FSTYPE_KEY = "csi.storage.k8s.io/fstype"
# Passed through to the node plugin unchanged; it validates them where they are used.
NODE_KEYS = ("mounter", "mapOptions", "unmapOptions", "mkfsOptions")
KNOWN_KEYS = ("clusterID", "pool", "dataPool", "imageFeatures", "imageFormat", "volumeNamePrefix", *NODE_KEYS,
              topology.KEY, *encryption.KEYS, *qos.KEYS)
TENANT_KEY = "csi.storage.k8s.io/pvc/namespace"
"""The claim's namespace: ceph-csi's volume Owner, the tenant of per-tenant KMS settings."""
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
_PREFIX = re.compile(r"^[A-Za-z0-9._-]{0,64}$")


@dataclass(frozen=True)
class VolumeParameters:
    cluster_id: str
    pool: str
    data_pool: str = ""
    features: tuple[str, ...] = DEFAULT_FEATURES
    name_prefix: str = DEFAULT_PREFIX
    fs_type: str = ""
    node_options: tuple[tuple[str, str], ...] = ()
    encryption: EncryptionSpec | None = None
    tenant: str = ""
    topology_pools: tuple[topology.TopologyPool, ...] = ()
    """`topologyConstrainedPools`: where a volume with accessibility requirements goes
    (cephcsi.volumes.placement); `pool` keeps the rest."""

    @classmethod
    def parse(cls, parameters: Mapping[str, str]) -> VolumeParameters:
        unknown = sorted(k for k in parameters if k not in KNOWN_KEYS and not k.startswith(KUBERNETES_PREFIX))
        if unknown:
            raise InvalidArgument(
                f"unknown parameter(s) {', '.join(unknown)}; supported: {', '.join(KNOWN_KEYS)}"
            )
        cluster_id = parameters.get("clusterID", "")
        if not cluster_id:
            raise InvalidArgument("parameter clusterID is required (the clusterID of an entry in config.json)")
        pool = parameters.get("pool", "")
        if not pool:
            raise InvalidArgument("parameter pool is required (the RBD pool to create images in)")
        for key in ("pool", "dataPool"):
            value = parameters.get(key, "")
            if value and not _NAME.match(value):
                raise InvalidArgument(f"parameter {key}={value!r} is not a valid pool name")
        image_format = parameters.get("imageFormat", "2")
        if image_format != "2":
            raise InvalidArgument(f"parameter imageFormat={image_format!r} is not supported; only format 2 images")
        prefix = parameters.get("volumeNamePrefix", DEFAULT_PREFIX)
        if not _PREFIX.match(prefix):
            raise InvalidArgument(
                f"parameter volumeNamePrefix={prefix!r} may hold at most 64 letters, digits, '.', '_' or '-'"
            )
        # block (LUKS2) or file (fscrypt, set up by the node in the filesystem): the controller keeps
        # the passphrase the same way for both (cephcsi.volumes.encrypted).
        wanted = encryption.from_parameters(parameters)
        pools = topology.parse(parameters[topology.KEY]) if parameters.get(topology.KEY) else ()
        for entry in pools:
            for value in (entry.pool, entry.data_pool):
                if value and not _NAME.match(value):
                    raise InvalidArgument(f"parameter {topology.KEY}: {value!r} is not a valid pool name")
        return cls(
            cluster_id=cluster_id,
            pool=pool,
            data_pool=parameters.get("dataPool", ""),
            features=parse_features(parameters.get("imageFeatures")),
            name_prefix=prefix,
            fs_type=parameters.get(FSTYPE_KEY, ""),
            node_options=tuple((k, parameters[k]) for k in NODE_KEYS if parameters.get(k)),
            encryption=wanted,
            tenant=parameters.get(TENANT_KEY, ""),
            topology_pools=pools,
        )

    def volume_context(self, image_name: str, rados_namespace: str) -> dict[str, str]:
        context = {"clusterID": self.cluster_id, "pool": self.pool, "imageName": image_name}
        if rados_namespace:
            context["radosNamespace"] = rados_namespace
        if self.data_pool:
            context["dataPool"] = self.data_pool
        context.update(self.node_options)
        if self.encryption is not None:
            context.update(self.encryption.volume_context())
        return context


def parse_features(text: str | None) -> tuple[str, ...]:
    """`imageFeatures`: comma-separated; unset means layering; an empty string means none."""
    if text is None:
        return DEFAULT_FEATURES
    features = tuple(dict.fromkeys(f.strip() for f in text.split(",") if f.strip()))
    bad = [f for f in features if f not in KNOWN_FEATURES]
    if bad:
        raise InvalidArgument(
            f"parameter imageFeatures: unknown feature(s) {', '.join(bad)}; supported: {', '.join(KNOWN_FEATURES)}"
        )
    for feature in features:
        needed = FEATURE_NEEDS.get(feature)
        if needed and needed not in features:
            raise InvalidArgument(f"parameter imageFeatures: {feature} requires {needed} to be listed too")
    return features
