"""API calls on the groupsnapshot.storage.k8s.io/v1 objects (the VolumeGroupSnapshot CRDs of
kubernetes-csi/external-snapshotter, GA in v8.6): the snapshotter's calls on another group."""
from __future__ import annotations

from cephcsi.sidecars.snapshotter.api import SnapshotApi

GROUP = "groupsnapshot.storage.k8s.io"
VERSION = "v1"
CONTENTS = "volumegroupsnapshotcontents"
CLASSES = "volumegroupsnapshotclasses"


class GroupSnapshotApi(SnapshotApi):
    group, version, contents, classes = GROUP, VERSION, CONTENTS, CLASSES
    content_kind, class_kind = "VolumeGroupSnapshotContent", "VolumeGroupSnapshotClass"
