"""The bench's scale seeding against a real apiserver: the objects it writes are accepted as
written and end up in the shape a controller's steady state has (claims and PVs Bound to each
other by uid, attachments attached, Nodes with CSINodes). Its own control plane: the seeded
cluster-scoped objects (PVs, VolumeAttachments, Nodes) must not show up in other tests' lists."""
from __future__ import annotations

import json

import pytest

from bench import scale_model as m
from bench import scale_seed
from tests.controlplane.cluster import start_control_plane

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.timeout(90)]


def test_seeded_claims_are_bound_and_attached() -> None:
    plane = start_control_plane()
    api = scale_seed.RawApi(plane.url, plane.token, str(plane.ca_file))
    try:
        api.create("/api/v1/namespaces", {"metadata": {"name": "seed"}})
        seed = m.Seed(namespace="seed", storage_class="sc", secret=("sns", "sec"), cluster_id="c1", pool="rbd",
                      attacher_finalizer="external-attacher/rbd-csi-ceph-com")
        scale_seed.seed_nodes(api)
        done = scale_seed.seed_claims(api, seed, 0, 6, threads=3)
        assert done.errors == [] and done.requests == 6 * 6
        again = scale_seed.seed_claims(api, seed, 0, 2, threads=2)  # idempotent: existing objects left alone
        assert again.errors == []

        claims = {c["metadata"]["name"]: c for c in api.call("GET", "/api/v1/namespaces/seed/persistentvolumeclaims")["items"]}
        pvs = {p["metadata"]["name"]: p for p in api.call("GET", "/api/v1/persistentvolumes")["items"]}
        vas = api.call("GET", "/apis/storage.k8s.io/v1/volumeattachments")["items"]
        assert len(claims) == len(pvs) == len(vas) == 6
        for i in range(6):
            claim, pv = claims[m.claim_name(i)], pvs[m.pv_name(i)]
            assert claim["status"]["phase"] == "Bound" and pv["status"]["phase"] == "Bound"
            assert pv["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
        assert all(va["status"]["attached"] for va in vas)
        nodes = api.call("GET", "/api/v1/nodes")["items"]
        csinodes = api.call("GET", "/apis/storage.k8s.io/v1/csinodes")["items"]
        assert len(nodes) == len(csinodes) == m.NODES
        assert json.loads(nodes[0]["metadata"]["annotations"]["csi.volume.kubernetes.io/nodeid"]) == {
            m.DRIVER: nodes[0]["metadata"]["name"]}
    finally:
        api.close()
        plane.stop()
