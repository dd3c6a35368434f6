"""The scale section's pure figures: seeded object shapes, Go sidecars' sync time from their klog
lines, growth per 1,000 claims between an empty and a loaded cluster."""
from __future__ import annotations

import datetime

import pytest

from bench import scale_model as m
from bench.cli import build_parser, options_from
from bench.sections import scale

pytestmark = pytest.mark.unit

SEED = m.Seed(namespace="ns", storage_class="sc", secret=("sns", "sec"), cluster_id="c1", pool="rbd",
              attacher_finalizer="external-attacher/rbd-csi-ceph-com")
UTC = datetime.timezone.utc


def test_seeded_claim_pv_and_attachment_point_at_each_other() -> None:
    pvc, pv, va = m.pvc_body(SEED, 7), m.pv_body(SEED, 7, "uid-7"), m.attachment_body(SEED, 7)
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"] == va["spec"]["source"]["persistentVolumeName"]
    assert pv["spec"]["claimRef"] == {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "ns",
                                      "name": pvc["metadata"]["name"], "uid": "uid-7"}
    assert pv["spec"]["csi"]["driver"] == va["spec"]["attacher"] == m.DRIVER
    # Attached by the embedded attacher: its finalizer on the attachment and the PV, status attached.
    assert SEED.attacher_finalizer in va["metadata"]["finalizers"]
    assert SEED.attacher_finalizer in pv["metadata"]["finalizers"]
    assert m.attachment_status() == {"status": {"attached": True}}
    assert va["spec"]["nodeName"] == m.node_name(7) == m.node_name(7 + m.NODES)


def test_seeded_names_are_distinct_and_volume_handles_carry_the_cluster() -> None:
    assert len({m.claim_name(i) for i in range(20000)}) == 20000
    assert len({m.volume_handle(SEED, i) for i in range(20000)}) == 20000
    assert m.volume_handle(SEED, 3).startswith("0001-0002-c1-")
    assert len({m.node_name(i) for i in range(1000)}) == m.NODES


STRUCTURED = ('I1127 11:50:01.250000   4242 reflector.go:430] "Caches populated" '
              'type="*v1.PersistentVolume" reflector="k8s.io/client-go/informers/factory.go:160"')
CLASSIC = "I1127 11:50:02.500000       1 reflector.go:351] Caches populated for *v1.StorageClass from factory.go:160"


def test_caches_populated_reads_both_klog_formats_and_keeps_the_first_line() -> None:
    text = "\n".join([
        "I1127 11:50:00.000000   4242 main.go:1] Version: v6.4.0",
        STRUCTURED,
        CLASSIC,
        STRUCTURED.replace("11:50:01.25", "11:59:01.25"),  # a relist later does not move the sync time
        'W1127 11:50:03.000000   4242 x.go:1] "Caches populated" type="*v1.PersistentVolumeClaim"',
    ])
    got = m.caches_populated(text, 2026)
    assert got == {"PersistentVolume": datetime.datetime(2026, 11, 27, 11, 50, 1, 250000, tzinfo=UTC),
                   "StorageClass": datetime.datetime(2026, 11, 27, 11, 50, 2, 500000, tzinfo=UTC),
                   "PersistentVolumeClaim": datetime.datetime(2026, 11, 27, 11, 50, 3, tzinfo=UTC)}
    assert m.synced_at(got, ["PersistentVolume", "StorageClass"]) == datetime.datetime(
        2026, 11, 27, 11, 50, 2, 500000, tzinfo=UTC)
    assert m.synced_at(got, ["PersistentVolume", "VolumeAttachment"]) is None  # one still loading
    assert m.synced_at(got, []) is None
    assert m.klog_time("not a klog line", 2026) is None


def test_growth_per_1000_claims_from_the_medians_with_the_range_the_rounds_allow() -> None:
    g = m.growth_per_1000([100.0, 104.0], [200.0, 210.0], 5000)
    assert g is not None
    # Nearest-rank median of two values is the lower one.
    assert g.base == 100.0
    assert g.per_1000 == pytest.approx((200.0 - 100.0) / 5)
    assert g.low == pytest.approx((200.0 - 104.0) / 5)
    assert g.high == pytest.approx((210.0 - 100.0) / 5)
    assert m.predict(g, 20000) == pytest.approx(100.0 + 20 * 20.0)
    assert m.growth_per_1000([], [1.0], 10) is None
    assert m.growth_per_1000([1.0], [2.0], 0) is None


def test_a_side_that_failed_gives_no_value_and_no_ratio_for_its_round() -> None:
    ok = scale.Start("cephcsi", 5, synced_s=2.0, rss_bytes=300 << 20)
    failed = scale.Start("go", 5, synced_s=1.0, error="boom")
    go = scale.Start("go", 5, synced_s=4.0, rss_bytes=600 << 20)
    table = scale.main_table({5: [(ok, failed), (ok, go)]}, 60)
    synced = next(r for r in table.rows if r[0].startswith("informers synced"))
    assert synced[2:] == ["2.00", "4.00", "0.50× (0.50–0.50)"]
    rss = next(r for r in table.rows if r[0].startswith("VmRSS"))
    assert rss[2:4] == ["300.0", "600.0"]


def test_scale_flags_and_quick_defaults() -> None:
    opts = options_from(build_parser().parse_args(["--sections", "scale", "--scale-claims", "20000",
                                                   "--scale-idle", "10"]))
    assert (opts.scale_claims, opts.scale_idle_s, opts.scale_rounds, opts.sections) == (20000, 10.0, 2, ("scale",))
    quick = options_from(build_parser().parse_args(["--quick"]))
    assert quick.scale_claims < 1000 and quick.scale_idle_s < 60
    with pytest.raises(SystemExit):
        options_from(build_parser().parse_args(["--scale-claims", "0"]))


def test_a_sidecar_with_a_marker_line_is_synced_only_once_that_line_is_written() -> None:
    populated = STRUCTURED + "\n" + CLASSIC
    started = 'I1127 11:50:04.000000   4242 controller.go:915] "Started provisioner controller" component="x"'
    kinds = ["PersistentVolume", "StorageClass"]
    assert m.ready_at(populated, 2026, kinds) == datetime.datetime(2026, 11, 27, 11, 50, 2, 500000, tzinfo=UTC)
    assert m.ready_at(populated, 2026, kinds, "Started provisioner controller") is None
    assert m.ready_at(populated + "\n" + started, 2026, kinds, "Started provisioner controller") == datetime.datetime(
        2026, 11, 27, 11, 50, 4, tzinfo=UTC)
    assert m.ready_at(started, 2026, kinds, "Started provisioner controller") is None  # caches not all populated
