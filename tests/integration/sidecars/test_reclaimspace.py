"""The reclaim-space schedule loop on the real control plane and Ceph: a real `cephcsi
--mode=controller` finds the claims whose csi-addons schedule annotation (on the claim, its
Namespace or its StorageClass, in that order) is due, sparsifies their images (zeros written through librbd come back: `rbd du`
drops), skips an image another client watches and an encrypted one (its image metadata says so,
as ceph-csi's layout has it), records each run on the claim (last-run, last-result, an Event)
and does not run it again before the schedule's next time; a claim without a schedule is left
alone and an unreadable schedule gets one Warning."""
from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest
import rados
import rbd

from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.pool_state import admin_ioctx
from tests.integration.sidecars.conftest import Env, StartControllers
from tests.integration.sidecars.harness import new_prefix, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.ceph]
MiB = 1 << 20
SCHEDULE = "reclaimspace.csiaddons.openshift.io/schedule"
LAST_RUN = "reclaimspace.cephcsi.ceph.io/last-run"
RESULT = "reclaimspace.cephcsi.ceph.io/last-result"
LONG_AGO = "2020-01-01T00:00:00Z"


def notes(env: Env, namespace: str, name: str) -> dict[str, str]:
    return dict(((env.kube.pvc(namespace, name) or {}).get("metadata") or {}).get("annotations") or {})


def bound_image(env: Env, namespace: str, name: str, storage_class: str, claim_annotations: dict[str, str]) -> str:
    claim = env.kube.create_pvc(namespace, name, storage_class, size="16Mi")
    if claim_annotations:
        env.kube.core.patch_namespaced_persistent_volume_claim(
            name, namespace, {"metadata": {"annotations": claim_annotations}})
    pv_name = f"pvc-{claim['metadata']['uid']}"
    wait_for(f"{name} Bound", lambda: ((env.kube.pvc(namespace, name) or {}).get("status") or {}).get("phase") == "Bound")
    return str((env.kube.pv(pv_name) or {})["spec"]["csi"]["volumeAttributes"]["imageName"])


def write_zeros(io: rados.Ioctx, image: str, size: int) -> None:
    with rbd.Image(io, image) as opened:
        opened.write(b"\0" * size, 0)
        opened.flush()


def du(ceph: CephTestCluster, image: str) -> int:
    doc = json.loads(ceph.admin("rbd", "du", "--format", "json", f"{ceph.pool}/{image}"))
    return int(next(entry["used_size"] for entry in doc["images"] if entry["name"] == image))


def reasons(env: Env, namespace: str, name: str) -> list[str]:
    return [reason for _type, reason, _message in env.kube.events(namespace, name)]


def test_due_claims_are_sparsified_and_recorded(env: Env, start_controllers: StartControllers,
                                                kube_namespace: str) -> None:
    plain = env.kube.create_storage_class(env.ceph, env.secret, prefix=new_prefix())
    scheduled_class = env.kube.create_storage_class(env.ceph, env.secret, prefix=new_prefix())
    ns = kube_namespace
    start_controllers(args=["--reclaimspace-poll-interval=1s"])
    # Bound without a schedule first: the data goes in before anything is due.
    images = {
        "due": bound_image(env, ns, "due", plain, {LAST_RUN: LONG_AGO}),
        "by-class": bound_image(env, ns, "by-class", scheduled_class, {LAST_RUN: LONG_AGO}),
        "busy": bound_image(env, ns, "busy", plain, {LAST_RUN: LONG_AGO}),
        "sealed": bound_image(env, ns, "sealed", plain, {LAST_RUN: LONG_AGO}),
        "none": bound_image(env, ns, "none", plain, {LAST_RUN: LONG_AGO}),
        "not-yet": bound_image(env, ns, "not-yet", plain, {}),
    }
    with admin_ioctx(env.ceph) as io:
        for image in images.values():
            write_zeros(io, image, 8 * MiB)
        assert {name: du(env.ceph, image) for name, image in images.items()} == dict.fromkeys(images, 8 * MiB)
        # Marked as a formatted LUKS volume (what a node's first stage writes): its zeros stand for
        # ciphertext here, which a real encrypted volume never has; the sparsify must not read it.
        env.ceph.admin("rbd", "image-meta", "set", f"{env.ceph.pool}/{images['sealed']}",
                       "rbd.csi.ceph.com/encrypted", "encrypted")
        with rbd.Image(io, images["busy"]) as user:  # a read-write open watches it, as a mapped device does
            user.size()
            for name, schedule in (("due", "@daily"), ("busy", "0 3 * * *"), ("sealed", "@daily"),
                                   ("not-yet", "@yearly")):
                # not-yet: created just now, so its first time is next January 1st
                env.kube.core.patch_namespaced_persistent_volume_claim(
                    name, ns, {"metadata": {"annotations": {SCHEDULE: schedule}}})
            env.kube.storage.patch_storage_class(scheduled_class, {"metadata": {"annotations": {SCHEDULE: "@weekly"}}})
            wait_for("the busy claim's run", lambda: notes(env, ns, "busy").get(LAST_RUN, LONG_AGO) != LONG_AGO,
                     timeout=60)
        assert notes(env, ns, "busy")[RESULT].startswith("skipped: in use")
        wait_for("the encrypted claim's run", lambda: notes(env, ns, "sealed").get(LAST_RUN, LONG_AGO) != LONG_AGO,
                 timeout=60)
        assert notes(env, ns, "sealed")[RESULT].startswith("skipped: encrypted")
        assert du(env.ceph, images["sealed"]) == 8 * MiB
        for name in ("due", "by-class"):
            wait_for(f"{name}'s run", lambda: notes(env, ns, name).get(LAST_RUN, LONG_AGO) != LONG_AGO, timeout=60)
            assert notes(env, ns, name)[RESULT] == f"reclaimed {8 * MiB}"
            assert du(env.ceph, images[name]) == 0
            wait_for(f"{name}'s event", lambda: "ReclaimSpace" in reasons(env, ns, name))
        ran = {name: notes(env, ns, name)[LAST_RUN] for name in ("due", "by-class", "busy", "sealed")}

        # An unreadable schedule: one Warning, no run.
        env.kube.core.patch_namespaced_persistent_volume_claim(
            "none", ns, {"metadata": {"annotations": {SCHEDULE: "every day"}}})
        wait_for("the invalid schedule's warning", lambda: "ReclaimSpaceScheduleInvalid" in reasons(env, ns, "none"))
        time.sleep(3)  # a few more polls of the loop (1 s each)
        # Nothing runs again before the schedule's next time; untouched claims stay untouched.
        assert {name: notes(env, ns, name)[LAST_RUN] for name in ran} == ran
        assert notes(env, ns, "none")[LAST_RUN] == LONG_AGO and RESULT not in notes(env, ns, "none")
        assert LAST_RUN not in notes(env, ns, "not-yet")
        assert du(env.ceph, images["none"]) == du(env.ceph, images["not-yet"]) == du(env.ceph, images["busy"]) == 8 * MiB
        assert reasons(env, ns, "none").count("ReclaimSpaceScheduleInvalid") == 1
    for name in images:
        env.kube.delete_pvc(ns, name)


def test_a_namespace_schedule_applies_between_the_claims_and_the_classes(
        env: Env, start_controllers: StartControllers, kube_namespace: str) -> None:
    """csi-addons' order: the Namespace's schedule beats the StorageClass's, the claim's own beats
    the Namespace's; the Namespace is read from the leader's informer, so annotating it later is
    seen without a restart."""
    ns = kube_namespace
    yearly_class = env.kube.create_storage_class(env.ceph, env.secret, prefix=new_prefix())
    env.kube.storage.patch_storage_class(yearly_class, {"metadata": {"annotations": {SCHEDULE: "@yearly"}}})
    # Ran two hours ago: not due again under @yearly (it is not new year), due under @hourly.
    earlier = (datetime.now(UTC) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    start_controllers(args=["--reclaimspace-poll-interval=1s"])
    images = {
        "by-namespace": bound_image(env, ns, "by-namespace", yearly_class, {LAST_RUN: earlier}),
        "own": bound_image(env, ns, "own", yearly_class, {LAST_RUN: earlier, SCHEDULE: "@yearly"}),
    }
    with admin_ioctx(env.ceph) as io:
        for image in images.values():
            write_zeros(io, image, 8 * MiB)
    time.sleep(3)  # a few polls: the class's (and the claim's own) @yearly is not due
    assert {name: notes(env, ns, name)[LAST_RUN] for name in images} == dict.fromkeys(images, earlier)

    env.kube.core.patch_namespace(ns, {"metadata": {"annotations": {SCHEDULE: "@hourly"}}})
    wait_for("the namespace-scheduled claim's run",
             lambda: notes(env, ns, "by-namespace").get(LAST_RUN, earlier) != earlier, timeout=60)
    assert notes(env, ns, "by-namespace")[RESULT] == f"reclaimed {8 * MiB}"
    assert du(env.ceph, images["by-namespace"]) == 0
    time.sleep(2)
    # The claim's own schedule still rules it: not run, its zeros still allocated.
    assert notes(env, ns, "own")[LAST_RUN] == earlier and RESULT not in notes(env, ns, "own")
    assert du(env.ceph, images["own"]) == 8 * MiB
    for name in images:
        env.kube.delete_pvc(ns, name)
