"""docs/migrate-from-ceph-csi.md walked on the real node, with volumes in use.

Start state, "ceph-csi is installed": cephcsi's controller is scaled to 0 and its node plugin
held back by overlays/migration/ (rendered over this install's config.json, as the e2e env
applies deploy/); ceph-csi's node plugin is the stand-in of tests/e2e/ceph_csi_node.py (its
docstring says why a stand-in and what differs: the mapping). Two claims of a StorageClass in
ceph-csi's example shape are bound to volumes exactly as ceph-csi made them: journal entries in
ceph-csi's order and keys (tests/ceph/ceph_csi_journal.py), image csi-vol-<uuid>, volume id
`0001-<len>-<clusterID>-<pool id>-<uuid>`, PVs as ceph-csi's external-provisioner writes them, and
attachments as its csi-attacher leaves them (played by the test: finalizer + attached; the
finalizer is external-attacher's, which cephcsi's attacher uses too). Pods
write through the stand-in (one ext4 volume, one Block volume).

ceph-csi's side (class, volumes, attachments, the stand-in as a process): tests/e2e/ceph_csi_side.py.

Then the guide's steps, in order: 2 (apply overlays/migration/: controller up, node plugin held
back), 3 (the attacher continues ceph-csi's attachments as its own: still attached, same
finalizer, no error), 4 (label `pending`, ceph-csi's pod
leaves, label `true`, cephcsi's plugin Ready and registered; the running pods keep their data;
their deletion is NodeUnpublish/NodeUnstage by cephcsi on ceph-csi's layout; new pods are staged
by cephcsi and read what was written under ceph-csi), 5 (apply deploy/, remove the label, the
node plugin is not restarted); last, deleting the claims deletes the ceph-csi volumes entirely
(their attachments detached by cephcsi's attacher, which releases ceph-csi's finalizer).

The shared e2e environment is restored in any case (deploy/ applied, label removed, driver Ready).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e import host
from tests.e2e.ceph_csi_node import STASH, stash
from tests.e2e.ceph_csi_side import (
    ATTACHER_FINALIZER,
    CEPH_CSI_CLASS,
    Claim,
    StandIn,
    attach_as_ceph_csi,
    attachments_of,
    ceph_csi_class,
    device_in_use,
    provision_as_ceph_csi,
    provisioner_identity,
)
from tests.e2e.checks import node_leftovers, wait_ceph_gone, watchers
from tests.e2e.env import IMAGE, REPO, E2EEnv, quickstart_config, write_overlay
from tests.e2e.kube import CONTROLLER_LABELS, DEPLOY_NAMESPACE, DRIVER, NODE_LABELS, Kube, wait_for
from tests.e2e.test_volumes import IDLE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600, func_only=True)]

MIGRATION_OVERLAY = REPO / "overlays" / "migration"
LABEL = "cephcsi.migrated"
BLOCK_READ = "dd if=/dev/e2e-block bs=32 count=1 skip={block} 2>/dev/null"
BLOCK_WRITE = ("printf %s {token} > /tmp/t && "
               "dd if=/tmp/t of=/dev/e2e-block bs=32 count=1 seek={block} conv=notrunc,fsync 2>/dev/null")


# ---- the install's side ------------------------------------------------------------------------


def apply_migration_overlay(env: E2EEnv, directory: Path) -> None:
    """`kubectl apply -k overlays/migration/` with this install's config.json, the same way the
    e2e env applies deploy/."""
    write_overlay(directory, quickstart_config(env.ceph), base=MIGRATION_OVERLAY)
    env.kube.kubectl("apply", "-k", str(directory))


def node_daemonset(kube: Kube) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(kube.kubectl("-n", DEPLOY_NAMESPACE, "get", "ds", "cephcsi-node", "-o", "json"))
    return doc


def label_node(kube: Kube, node: str, value: str | None) -> None:
    if value is None:
        kube.kubectl("label", "node", node, f"{LABEL}-")
    else:
        kube.kubectl("label", "node", node, f"{LABEL}={value}", "--overwrite")


def restore_install(env: E2EEnv) -> None:
    """deploy/ applied (controller replicas, no selector), no label, the driver Ready."""
    kube = env.kube
    kube.kubectl("apply", "-k", str(env.overlay))
    kube.kubectl("label", "node", env.node.name, f"{LABEL}-")
    kube.wait_driver_ready(env.node.name)


# ---- pods ----------------------------------------------------------------------------------------


def start_pod(kube: Kube, namespace: str, name: str, claim: Claim, script: str = IDLE) -> None:
    kube.create_pod(namespace, name, IMAGE, script, claim.name, block=claim.block)


def read_tokens(kube: Kube, namespace: str, pod: str, claim: Claim) -> list[str]:
    if claim.block:
        return [kube.exec_in(namespace, pod, BLOCK_READ.format(block=n)) for n in (0, 128)]
    return [kube.exec_in(namespace, pod, f"cat /data/token{n} 2>/dev/null || true").strip() for n in (0, 1)]


def write_token(kube: Kube, namespace: str, pod: str, claim: Claim, index: int, token: str) -> None:
    if claim.block:
        kube.exec_in(namespace, pod, BLOCK_WRITE.format(token=token, block=index * 128))
    else:
        kube.exec_in(namespace, pod, f"echo {token} > /data/token{index} && sync")


def wait_token(kube: Kube, namespace: str, pod: str, claim: Claim, token: str) -> None:
    """The pod's first write (its command runs while the pod already counts as Ready)."""
    wait_for(f"{pod} wrote its token", lambda: read_tokens(kube, namespace, pod, claim)[0] == token, timeout=30)


def check_taken_over(kube: Kube, claim: Claim) -> None:
    """ceph-csi's attachments are the attacher's own (same finalizer): left attached as they were,
    with no attachError and no finalizer of another name; the PV keeps the finalizer too."""
    [attachment] = attachments_of(kube, claim.pv_name)
    status = attachment.get("status") or {}
    assert status.get("attached") is True and not status.get("attachError"), json.dumps(attachment)[:2000]
    assert attachment["metadata"].get("finalizers") == [ATTACHER_FINALIZER], json.dumps(attachment)[:2000]
    assert ATTACHER_FINALIZER in (kube.pv(claim.pv_name) or {})["metadata"].get("finalizers", [])


def wait_unmounted(claim: Claim) -> None:
    wait_for(f"nothing of {claim.pv_name} mounted under the kubelet",
             lambda: not node_leftovers(claim.pv, claim.volume.image).mounts, timeout=60,
             explain=lambda: repr(node_leftovers(claim.pv, claim.volume.image)))


def wait_unwatched(env: E2EEnv, claim: Claim) -> None:
    wait_for(f"no watcher on {claim.volume.image}", lambda: not watchers(env.ceph, claim.volume.image), timeout=60)


# ---- the walk --------------------------------------------------------------------------------------


@pytest.fixture
def stand_in(e2e: E2EEnv) -> Iterator[StandIn]:
    # Short, on tmpfs, outside the kubelet's and cephcsi's folders (as krbd's state is).
    work_dir = Path(tempfile.mkdtemp(prefix="ccsi-", dir="/run"))
    standin = StandIn(work_dir, e2e.work_dir / f"ceph-csi-stand-in-{work_dir.name}.log")
    yield standin
    standin.stop()


def test_migration_guide_with_volumes_in_use(e2e: E2EEnv, namespace: str, stand_in: StandIn) -> None:
    kube, node = e2e.kube, e2e.node.name
    overlay = e2e.work_dir / "migration-overlay"
    sc = ceph_csi_class(e2e)
    pods = {False: "app-fs", True: "app-block"}
    claims: dict[bool, Claim] = {}
    tokens = {block: [uuid.uuid4().hex, uuid.uuid4().hex] for block in (False, True)}
    try:
        # -- Start state: ceph-csi installed, cephcsi not running on the node or the controller.
        apply_migration_overlay(e2e, overlay)
        kube.kubectl("-n", DEPLOY_NAMESPACE, "scale", "deployment", "cephcsi-controller", "--replicas=0")
        wait_for("cephcsi's pods gone", lambda: not kube.pods(DEPLOY_NAMESPACE, NODE_LABELS)
                 and not kube.pods(DEPLOY_NAMESPACE, CONTROLLER_LABELS), timeout=120)
        stand_in.start(e2e)
        wait_for(f"CSINode listing {DRIVER} (ceph-csi's plugin)", lambda: DRIVER in kube.csinode_drivers(node), 60)
        kube.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(sc))
        identity = provisioner_identity()
        for block in (False, True):
            claims[block] = provision_as_ceph_csi(e2e, namespace, "raw" if block else "data", sc, block, identity)
        for block, claim in claims.items():
            write = BLOCK_WRITE.format(token=tokens[block][0], block=0) if block else \
                f"echo {tokens[block][0]} > /data/token0 && sync"
            start_pod(kube, namespace, pods[block], claim, f"{write} && {IDLE}")
        for claim in claims.values():
            attach_as_ceph_csi(kube, claim.pv_name)
        for block, claim in claims.items():
            kube.wait_pod_ready(namespace, pods[block])
            # ceph-csi's layout on the node, byte for byte where it is a file.
            staged = claim.staging / claim.volume.volume_id
            stash_path = claim.staging / STASH
            assert stash_path.read_bytes() == stash(e2e.ceph.pool, claim.volume.image, "")
            assert stash_path.stat().st_mode & 0o777 == 0o600
            # Block: the device node bound onto the file ceph-csi created.
            assert (staged.is_block_device() if block else staged.is_dir()), staged
            assert any(m.mount_point == str(staged) for m in host.mounts()), f"{staged} is not mounted"
            assert not (claim.staging / "cephcsi-stage.json").exists()
            wait_token(kube, namespace, pods[block], claim, tokens[block][0])

        # -- Step 1 is done (the controller is at 0); step 2: the migration overlay.
        apply_migration_overlay(e2e, overlay)
        kube.kubectl("-n", DEPLOY_NAMESPACE, "rollout", "status", "deployment/cephcsi-controller", "--timeout=180s",
                     timeout=200)
        wait_for("cephcsi-node DESIRED 0", lambda: node_daemonset(kube).get("status", {})
                 .get("desiredNumberScheduled") == 0 and not kube.pods(DEPLOY_NAMESPACE, NODE_LABELS), timeout=60)
        assert stand_in.process is not None and not stand_in.exited()

        # -- Step 3: the attacher continues ceph-csi's attachments as its own. Once it leads, its
        # first pass replays every attachment; a few seconds later nothing may have changed.
        wait_for("the controller's attacher started", lambda: "attacher started" in kube.kubectl(
            "-n", DEPLOY_NAMESPACE, "logs", "-l", CONTROLLER_LABELS, "--tail=-1"), timeout=120)
        time.sleep(5)
        for claim in claims.values():
            check_taken_over(kube, claim)

        # -- Step 4: `pending` sends ceph-csi's plugin away; then `true` lets cephcsi's in.
        label_node(kube, node, "pending")
        time.sleep(2)
        assert not kube.pods(DEPLOY_NAMESPACE, NODE_LABELS), "cephcsi's plugin must not start on `pending`"
        stand_in.stop()  # ceph-csi's DaemonSet pod leaves the node (its affinity: label DoesNotExist)
        wait_for(f"the kubelet deregistered {DRIVER}", lambda: DRIVER not in kube.csinode_drivers(node), timeout=60)
        # The guide's commands, as a script would run them.
        kube.kubectl("label", "node", node, f"{LABEL}=true", "--overwrite")
        wait_for("cephcsi's node pod exists", lambda: kube.kubectl(
            "-n", DEPLOY_NAMESPACE, "get", "pod", "-l", "app.kubernetes.io/component=node", "--field-selector",
            f"spec.nodeName={node}", "-o", "name").strip(), timeout=60)
        kube.kubectl("-n", DEPLOY_NAMESPACE, "wait", "--for=condition=Ready", "pod", "-l",
                     "app.kubernetes.io/component=node", "--field-selector", f"spec.nodeName={node}",
                     "--timeout=120s", timeout=150)
        wait_for(f"CSINode listing {DRIVER} (cephcsi's plugin)", lambda: DRIVER in kube.kubectl(
            "get", "csinode", node, "-o", "jsonpath={.spec.drivers[*].name}").split(), 60)
        [plugin] = kube.ready_pods(NODE_LABELS)

        # The running pods never noticed: their data, and new writes, through ceph-csi's mapping.
        for block, claim in claims.items():
            write_token(kube, namespace, pods[block], claim, 1, tokens[block][1])
            assert read_tokens(kube, namespace, pods[block], claim) == tokens[block]

        # Deleting them: cephcsi unpublishes and unstages ceph-csi's layout.
        for block in claims:
            kube.delete_pod(namespace, pods[block], timeout=120)
        for block, claim in claims.items():
            wait_unmounted(claim)
            assert not (claim.staging / STASH).exists(), "the stash goes with the stage"
            assert not os.path.lexists(claim.staging / claim.volume.volume_id)
            # Left: the stand-in's rbd-fuse + loop mapping, in place of ceph-csi's krbd device.
            # cephcsi's unstage ran the krbd unmap the stash asks for (`rbd device unmap`, which
            # would remove a real krbd device) and found nothing mapped here. So the mapping must
            # now be idle (nothing mounted from it, no opener), and tearing it down by hand is
            # what that unmap would have done.
            device = stand_in.loop_of(claim.volume.image)
            assert device_in_use(device) == [], device_in_use(device)
            stand_in.release(claim.volume.image)
            wait_unwatched(e2e, claim)
            assert not node_leftovers(claim.pv, claim.volume.image)

        # New pods on the same claims: staged by cephcsi, reading what was written under ceph-csi.
        for block, claim in claims.items():
            start_pod(kube, namespace, f"new-{pods[block]}", claim)
        for block, claim in claims.items():
            kube.wait_pod_ready(namespace, f"new-{pods[block]}")
            assert read_tokens(kube, namespace, f"new-{pods[block]}", claim) == tokens[block]
            assert (claim.staging / "cephcsi-stage.json").exists(), "staged by cephcsi, in its layout"

        # -- Step 5: deploy/ again, then the label goes; the node plugin is not restarted.
        kube.kubectl("apply", "-k", str(e2e.overlay))
        selector = node_daemonset(kube)["spec"]["template"]["spec"]["nodeSelector"]
        assert LABEL not in selector, selector
        label_node(kube, node, None)
        time.sleep(5)  # time for the DaemonSet controller to act, if it were going to
        [after] = kube.ready_pods(NODE_LABELS)
        assert after["metadata"]["uid"] == plugin["metadata"]["uid"]
        assert [c["restartCount"] for c in after["status"]["containerStatuses"]] == [0]

        # The claims go: cephcsi's controller deletes the volumes ceph-csi journaled.
        for block, claim in claims.items():
            kube.delete_pod(namespace, f"new-{pods[block]}", timeout=120)
            kube.delete_pvc(namespace, claim.name)
        for claim in claims.values():
            kube.wait_pv_gone(claim.pv_name, timeout=120)
            wait_ceph_gone(e2e.ceph, claim.pv, timeout=120)
            assert f"csi.volume.{claim.volume.uuid}" not in e2e.ceph.objects()
            assert not node_leftovers(claim.pv, claim.volume.image)
    finally:
        stand_in.stop()
        try:
            restore_install(e2e)
        finally:
            for pod in kube.pods(namespace):
                kube.delete_pod(namespace, pod["metadata"]["name"], timeout=120)
            stand_in.release_all()
            host.remove_tree(stand_in.work_dir)  # refuses while an rbd-fuse mount is live
            kube.kubectl("delete", "--ignore-not-found", "storageclass", CEPH_CSI_CLASS)
