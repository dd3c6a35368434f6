"""Load and render deploy/ for the tests, without a kubectl or kustomize binary.

`render()` does what `kubectl apply -k deploy/` does to the files, for the features
deploy/kustomization.yaml uses (namespace, images, file resources). Anything else in the
kustomization is refused, so using a new kustomize feature forces extending this renderer
(the unit tests also compare it with `kubectl kustomize` where that binary exists).

Also here: the permissions the controller and node identities must and must not have,
shared by the static RBAC check (unit) and the real-authorizer check (integration).
"""
from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
EXAMPLES = DEPLOY / "examples"
DOCKERFILE = REPO / "Dockerfile"

Obj = dict[str, Any]

# Kinds the deploy files use (and a few neighbours) that have no namespace.
CLUSTER_SCOPED = frozenset({
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CSIDriver", "StorageClass",
    "PersistentVolume", "PriorityClass", "CustomResourceDefinition", "Node", "CSINode",
    "VolumeAttachment",
})
SUPPORTED_KUSTOMIZATION_KEYS = frozenset({"apiVersion", "kind", "namespace", "resources", "images"})
# Apply order: what others depend on first (kustomize's legacy order starts the same way).
_ORDER = ["Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "Role",
          "ClusterRoleBinding", "RoleBinding", "ConfigMap", "Secret", "CSIDriver", "StorageClass"]


def load_docs(path: Path) -> list[Obj]:
    """Every non-empty YAML document of a file."""
    with path.open(encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc is not None]


def kustomization(directory: Path = DEPLOY) -> Obj:
    doc: Obj = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))
    return doc


def key(obj: Obj) -> tuple[str, str, str]:
    """(kind, namespace, name) — what identifies an object for apply."""
    meta = obj.get("metadata") or {}
    return (obj["kind"], meta.get("namespace", ""), meta["name"])


def pod_spec(obj: Obj) -> Obj | None:
    """The pod spec inside a workload object, or None."""
    kind = obj.get("kind")
    if kind == "Pod":
        return obj["spec"]  # type: ignore[no-any-return]
    if kind in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"):
        return obj["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    if kind == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    return None


def containers(obj: Obj) -> Iterator[Obj]:
    spec = pod_spec(obj)
    if spec is not None:
        yield from spec.get("initContainers") or []
        yield from spec.get("containers") or []


def split_image(image: str) -> tuple[str, str, str]:
    """name, tag, digest of an image reference (a ':' after the last '/' starts the tag)."""
    name, _, digest = image.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = ""
    if colon > slash:
        name, tag = name[:colon], name[colon + 1:]
    return name, tag, digest


def _set_image(container: Obj, entries: list[Obj]) -> None:
    name, tag, digest = split_image(container["image"])
    for entry in entries:
        if entry["name"] != name:
            continue
        name = entry.get("newName", name)
        tag = str(entry.get("newTag", tag))
        digest = entry.get("digest", digest)
        container["image"] = name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")
        return


def render(directory: Path = DEPLOY) -> list[Obj]:
    """The objects `kubectl apply -k directory` would send, in apply order."""
    kust = kustomization(directory)
    unsupported = set(kust) - SUPPORTED_KUSTOMIZATION_KEYS
    if unsupported:
        raise ValueError(f"kustomization uses {sorted(unsupported)}: extend tests/unit/deploy/manifests.py")
    namespace = kust.get("namespace", "")
    images = kust.get("images") or []
    objects: list[Obj] = []
    for resource in kust.get("resources") or []:
        path = directory / resource
        if not path.is_file():
            raise ValueError(f"kustomization resource {resource!r} is not a file in {directory}")
        objects.extend(copy.deepcopy(load_docs(path)))
    for obj in objects:
        meta = obj.setdefault("metadata", {})
        if namespace:
            if obj["kind"] == "Namespace":
                meta["name"] = namespace
            elif obj["kind"] not in CLUSTER_SCOPED:
                meta["namespace"] = namespace
            if obj["kind"] in ("RoleBinding", "ClusterRoleBinding"):
                for subject in obj.get("subjects") or []:
                    if subject.get("kind") == "ServiceAccount":
                        subject["namespace"] = namespace
        for container in containers(obj):
            _set_image(container, images)
    rank = {kind: index for index, kind in enumerate(_ORDER)}
    return sorted(objects, key=lambda o: rank.get(o["kind"], len(_ORDER)))


def find(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    matches = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    if len(matches) != 1:
        raise AssertionError(f"expected exactly one {kind} {name or ''}, found {len(matches)}")
    return matches[0]


_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expanded_args(container: Obj, values: dict[str, str] | None = None) -> list[str]:
    """The container's args with $(VAR) replaced as the kubelet would. A reference to a
    variable the container does not define stays literal in Kubernetes (a silent bug), so
    it is an error here."""
    defined = {env["name"] for env in container.get("env") or []}
    values = values or {}

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in defined:
            raise ValueError(f"container {container.get('name')!r} uses $({name}) but does not define it in env")
        return values.get(name, f"placeholder-{name.lower()}")

    return [_VAR.sub(substitute, str(arg)) for arg in container.get("args") or []]


def flag(args: list[str], name: str) -> str | None:
    """The value of --name=value in args (last one wins, as argparse does)."""
    value = None
    for arg in args:
        if arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
    return value


# ---- permissions -------------------------------------------------------------------------

NAMESPACE = "ceph-csi-rbd"
CONTROLLER_SA = "cephcsi-controller"
NODE_SA = "cephcsi-node"
OTHER_NAMESPACE = "kube-system"
TENANT_NAMESPACE = "tenant-a"
KMS_READER = "cephcsi-kms-reader"
"""Defined by deploy/ but bound by nobody: an admin binds it per namespace holding KMS Secrets."""


@dataclass(frozen=True)
class Access:
    """One request: verb on group/resource[/subresource], in namespace ('' = cluster-wide)."""

    verb: str
    group: str
    resource: str
    namespace: str = ""
    subresource: str = ""
    why: str = ""

    def __str__(self) -> str:
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        where = f" in {self.namespace}" if self.namespace else " (all namespaces)"
        return f"{self.verb} {self.group or 'core'}/{what}{where}"


def _each(verbs: str, group: str, resource: str, why: str, namespace: str = "", sub: str = "") -> list[Access]:
    return [Access(v, group, resource, namespace, sub, why) for v in verbs.split()]


# What the embedded provisioner and attacher do (external-provisioner/attacher semantics).
CONTROLLER_MUST = [
    *_each("get list watch update patch", "", "persistentvolumeclaims", "provisioner watches claims, sets annotations"),
    *_each("get list watch update patch", "", "persistentvolumeclaims", "claims live in user namespaces", namespace="default"),
    *_each("get list watch create delete patch update", "", "persistentvolumes", "provisioner creates/deletes PVs, manages its finalizer"),
    *_each("get list watch", "storage.k8s.io", "storageclasses", "parameters and secret references"),
    *_each("get", "storage.k8s.io", "volumeattributesclasses", "resizer modifies, provisioner creates with a class (read by name)"),
    *_each("get list watch patch", "storage.k8s.io", "volumeattachments", "attacher; provisioner checks attachment before delete"),
    *_each("patch", "storage.k8s.io", "volumeattachments", "attacher marks attached", sub="status"),
    *_each("get list watch", "", "namespaces", "reclaim space: a Namespace's schedule annotation"),
    *_each("get list watch", "", "nodes", "topology"),
    *_each("get list watch", "storage.k8s.io", "csinodes", "topology"),
    *_each("create patch", "", "events", "events on the PVC, in the PVC's namespace", namespace="default"),
    *_each("create patch", "", "events", "events in any namespace", namespace=OTHER_NAMESPACE),
    *_each("get create update", "coordination.k8s.io", "leases", "leader election", namespace=NAMESPACE),
    *_each("get", "", "secrets", "StorageClass secret references", namespace=NAMESPACE),
    *_each("patch", "", "persistentvolumeclaims", "resizer records a resize in the claim's status",
           namespace="default", sub="status"),
    *_each("get list watch patch", "snapshot.storage.k8s.io", "volumesnapshotcontents", "snapshotter"),
    *_each("patch", "snapshot.storage.k8s.io", "volumesnapshotcontents", "snapshotter status", sub="status"),
    *_each("get", "snapshot.storage.k8s.io", "volumesnapshotclasses", "snapshotter parameters and secrets"),
    *_each("get", "snapshot.storage.k8s.io", "volumesnapshots", "provisioner restores", namespace="default"),
    *_each("get list watch patch", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "group snapshotter"),
    *_each("patch", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "group snapshotter status",
           sub="status"),
    *_each("get", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotclasses", "group snapshotter parameters"),
    *_each("get list watch create update delete", "storage.k8s.io", "csistoragecapacities", "capacity tracking",
           namespace=NAMESPACE),
    *_each("get", "apps", "deployments", "owner of CSIStorageCapacity objects", namespace=NAMESPACE),
]
CONTROLLER_MUST_NOT = [
    *_each("create delete deletecollection", "", "persistentvolumeclaims", "never creates or deletes claims", namespace="default"),
    *_each("update", "", "persistentvolumeclaims", "resizer only patches the status", namespace="default", sub="status"),
    *_each("create update patch delete list watch", "", "secrets", "only reads secrets by name", namespace=NAMESPACE),
    *_each("get", "", "secrets", "secrets outside its namespace", namespace=OTHER_NAMESPACE),
    *_each("get list", "", "secrets", "no cluster-wide secret access"),
    *_each("get create update delete", "coordination.k8s.io", "leases", "other components' leases", namespace=OTHER_NAMESPACE),
    *_each("list watch delete", "coordination.k8s.io", "leases", "only its own lease by name", namespace=NAMESPACE),
    *_each("create delete", "storage.k8s.io", "volumeattachments", "the attach/detach controller owns them"),
    *_each("update delete", "storage.k8s.io", "storageclasses", "read-only"),
    *_each("list watch create update patch delete", "storage.k8s.io", "volumeattributesclasses", "read by name only"),
    *_each("update patch delete", "", "nodes", "read-only"),
    *_each("create update patch delete", "", "namespaces", "reads their annotations only"),
    *_each("get list create", "", "pods", "no pod access", namespace="default"),
    *_each("list create update delete", "apps", "deployments", "other API groups", namespace=NAMESPACE),
    *_each("get", "apps", "deployments", "its own namespace only", namespace=OTHER_NAMESPACE),
    *_each("create update", "storage.k8s.io", "csistoragecapacities", "its own namespace only", namespace=OTHER_NAMESPACE),
    *_each("create update", "rbac.authorization.k8s.io", "clusterroles", "no privilege escalation"),
    *_each("get list", "", "configmaps", "config is mounted, not read from the API", namespace=NAMESPACE),
    *_each("list watch get", "", "events", "writes events only", namespace="default"),
    *_each("create", "", "serviceaccounts", "token", namespace=NAMESPACE, sub="token"),
    *_each("list watch update patch delete", "snapshot.storage.k8s.io", "volumesnapshots",
           "reads a restore's VolumeSnapshot by name only", namespace="default"),
    *_each("create delete update", "snapshot.storage.k8s.io", "volumesnapshotcontents", "the snapshot-controller owns them"),
    *_each("create delete update", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents",
           "the snapshot-controller owns them"),
    *_each("get list watch create update patch delete", "groupsnapshot.storage.k8s.io", "volumegroupsnapshots",
           "never read", namespace="default"),
]
NODE_MUST = [
    *_each("get", "", "nodes", "topology labels of its own node"),
    *_each("get", "", "persistentvolumes", "reclaim space: the PV of a staged volume"),
    *_each("get", "", "persistentvolumeclaims", "reclaim space: the claim's last run", namespace="default"),
]
NODE_MUST_NOT = [
    *_each("list watch update patch", "", "nodes", "reads one node by name"),
    *_each("get list", "", "secrets", "staging secrets come in the CSI request", namespace=NAMESPACE),
    *_each("get", "", "secrets", "KMS Secrets only where an admin binds cephcsi-kms-reader", namespace=OTHER_NAMESPACE),
    *_each("get", "", "configmaps", "KMS ConfigMaps only where an admin binds cephcsi-kms-reader",
           namespace=OTHER_NAMESPACE),
    *_each("list watch", "", "persistentvolumes", "reclaim space reads one PV by name"),
    *_each("list watch update patch", "", "persistentvolumeclaims", "reclaim space reads one claim by name",
           namespace="default"),
    *_each("get list", "storage.k8s.io", "volumeattachments", "not needed"),
    *_each("get list", "", "pods", "not needed", namespace="default"),
    *_each("get update", "coordination.k8s.io", "leases", "node plugins do not elect", namespace=NAMESPACE),
    *_each("create", "", "events", "not needed", namespace="default"),
]

# The complete grant of each identity, rule by rule: a new permission must be added here,
# with its reason in deploy/*-rbac.yaml, or the unit tests fail (least-privilege ratchet).
# (binding kind, namespace of a RoleBinding or '') → {(group, resource): verbs}
CONTROLLER_GRANTS: dict[tuple[str, str], dict[tuple[str, str], frozenset[str]]] = {
    ("ClusterRoleBinding", ""): {
        ("", "persistentvolumeclaims"): frozenset({"get", "list", "watch", "update", "patch"}),
        ("", "persistentvolumeclaims/status"): frozenset({"patch"}),
        ("", "persistentvolumes"): frozenset({"get", "list", "watch", "create", "delete", "patch", "update"}),
        ("storage.k8s.io", "storageclasses"): frozenset({"get", "list", "watch"}),
        ("storage.k8s.io", "volumeattributesclasses"): frozenset({"get"}),
        ("storage.k8s.io", "volumeattachments"): frozenset({"get", "list", "watch", "patch"}),
        ("storage.k8s.io", "volumeattachments/status"): frozenset({"patch"}),
        ("", "namespaces"): frozenset({"get", "list", "watch"}),
        ("", "nodes"): frozenset({"get", "list", "watch"}),
        ("storage.k8s.io", "csinodes"): frozenset({"get", "list", "watch"}),
        ("", "events"): frozenset({"create", "patch"}),
        ("snapshot.storage.k8s.io", "volumesnapshotcontents"): frozenset({"get", "list", "watch", "patch"}),
        ("snapshot.storage.k8s.io", "volumesnapshotcontents/status"): frozenset({"patch"}),
        ("snapshot.storage.k8s.io", "volumesnapshotclasses"): frozenset({"get"}),
        ("snapshot.storage.k8s.io", "volumesnapshots"): frozenset({"get"}),
        ("groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents"): frozenset({"get", "list", "watch", "patch"}),
        ("groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents/status"): frozenset({"patch"}),
        ("groupsnapshot.storage.k8s.io", "volumegroupsnapshotclasses"): frozenset({"get"}),
    },
    ("RoleBinding", NAMESPACE): {
        ("coordination.k8s.io", "leases"): frozenset({"get", "create", "update"}),
        ("", "secrets"): frozenset({"get"}),
        ("storage.k8s.io", "csistoragecapacities"): frozenset({"get", "list", "watch", "create", "update", "delete"}),
        ("", "pods"): frozenset({"get"}),
        ("apps", "replicasets"): frozenset({"get"}),
        ("apps", "deployments"): frozenset({"get"}),
    },
}
NODE_GRANTS: dict[tuple[str, str], dict[tuple[str, str], frozenset[str]]] = {
    ("ClusterRoleBinding", ""): {("", "nodes"): frozenset({"get"}), ("", "persistentvolumes"): frozenset({"get"}),
                                 ("", "persistentvolumeclaims"): frozenset({"get"})},
}


def grants(objects: list[Obj], namespace: str, service_account: str) -> dict[tuple[str, str], dict[tuple[str, str], frozenset[str]]]:
    """What the bindings in `objects` give a ServiceAccount, per (binding kind, namespace)."""
    roles = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
             for o in objects if o["kind"] in ("Role", "ClusterRole")}
    result: dict[tuple[str, str], dict[tuple[str, str], set[str]]] = {}
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == service_account
                   and s.get("namespace") == namespace for s in binding.get("subjects") or []):
            continue
        where = binding["metadata"].get("namespace", "") if binding["kind"] == "RoleBinding" else ""
        ref = binding["roleRef"]
        role_ns = where if ref["kind"] == "Role" else ""
        role = roles.get((ref["kind"], role_ns, ref["name"]))
        if role is None:
            raise AssertionError(f"{binding['kind']} {binding['metadata']['name']} refers to missing {ref['kind']} {ref['name']}")
        bucket = result.setdefault((binding["kind"], where), {})
        for rule in role.get("rules") or []:
            for group in rule.get("apiGroups") or []:
                for resource in rule.get("resources") or []:
                    bucket.setdefault((group, resource), set()).update(rule.get("verbs") or [])
    return {where: {k: frozenset(v) for k, v in rules.items()} for where, rules in result.items()}


def statically_allowed(granted: dict[tuple[str, str], dict[tuple[str, str], frozenset[str]]], access: Access) -> bool:
    """Whether `granted` (from grants()) allows `access`, evaluated as the RBAC authorizer does
    for rules without resourceNames: cluster bindings apply everywhere, role bindings in their
    namespace only; '*' matches anything."""
    resource = access.resource + (f"/{access.subresource}" if access.subresource else "")
    for (binding_kind, where), rules in granted.items():
        if binding_kind == "RoleBinding" and where != access.namespace:
            continue
        for (group, res), verbs in rules.items():
            if group not in (access.group, "*") or res not in (resource, "*"):
                continue
            if access.verb in verbs or "*" in verbs:
                return True
    return False
