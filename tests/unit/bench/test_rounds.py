"""Figures that hold: per-round ratios, their median and spread, the verdicts against targets,
the controller's aggregation of interleaved rounds, and the background-load helpers."""
from __future__ import annotations

import os
import time
from typing import Any

import pytest

from bench import background, load, machine, report
from bench.load import Batch
from bench.model import Table
from bench.sections import controller_ops, node_ops
from bench.sections.node_ops import Timings
from bench.stats import Spread, pooled, ratio_spread, round_ratios, spread, within

pytestmark = pytest.mark.unit


def test_spread_is_nearest_rank_median_quartiles_and_range() -> None:
    s = spread([3.0, 1.0, 2.0, 5.0, 4.0])
    assert (s.n, s.median, s.low, s.high, s.q1, s.q3) == (5, 3.0, 1.0, 5.0, 2.0, 4.0)
    # Even count: the lower middle value, a figure that was measured (no averaging).
    assert spread([1.0, 2.0, 3.0, 4.0]).median == 2.0
    assert spread([7.0]) == Spread(1, 7.0, 7.0, 7.0, 7.0, 7.0)
    with pytest.raises(ValueError):
        spread([])
    assert spread([1.0, 2.0]).to_json()["median"] == 1.0


def test_round_ratios_pair_rounds_and_skip_missing_sides() -> None:
    assert round_ratios([2.0, 3.0, None, 4.0], [1.0, 2.0, 1.0, 0.0]) == [2.0, 1.5]
    with pytest.raises(ValueError):
        round_ratios([1.0], [1.0, 2.0])
    s = ratio_spread([1.2, 1.5, 1.3], [1.0, 1.0, 1.0])
    assert s is not None and s.median == pytest.approx(1.3) and s.low == pytest.approx(1.2) and s.high == 1.5
    assert ratio_spread([None], [1.0]) is None


def test_pooled_summary_takes_every_latency_and_the_summed_walls() -> None:
    s = pooled([[0.1, 0.2], [0.3]], [0.5, 0.25], concurrency=2, errors=1)
    assert (s.count, s.errors, s.p50_s, s.max_s) == (3, 1, 0.2, 0.3)
    assert s.throughput == pytest.approx(4.0)


def test_within_and_verdicts() -> None:
    assert within(1.4, 1.5) is True and within(1.6, 1.5) is False
    assert within(0.8, 0.75, at_most=False) is True and within(None, 1.0) is None
    assert report.verdict(Spread(3, 1.3, 1.2, 1.45, 1.2, 1.45), 1.5) == "1.30× (1.20–1.45) met"
    assert report.verdict(Spread(3, 1.3, 1.2, 1.7, 1.2, 1.7), 1.5) == "1.30× (1.20–1.70) met, spread crosses"
    assert report.verdict(Spread(3, 1.6, 1.2, 1.7, 1.2, 1.7), 1.5).endswith("NOT met")
    # A floor target (≥): the worst round is the lowest.
    assert report.verdict(Spread(3, 0.8, 0.7, 0.9, 0.7, 0.9), 0.75, at_most=False).endswith("met, spread crosses")
    assert report.verdict(None, 1.5) == "— (not measured)"


def test_spread_cells_format_and_count_as_numeric() -> None:
    s = Spread(5, 1.234, 1.1, 1.5, 1.2, 1.3)
    assert report.times_spread(s) == "1.23× (1.10–1.50)"
    assert report.times_spread(None) == "—"
    assert report.spread_range(Spread(2, 0.004, 0.003, 0.005, 0.003, 0.005), scale=1000) == "3.0–5.0"
    t = Table(columns=["what", "x"])
    t.add("a", report.times_spread(s))
    assert report.markdown_table(t).splitlines()[1] == "|---|---:|"


def _batch(latencies: list[float], wall: float, errors: int = 0) -> Batch[str]:
    return Batch(latencies=latencies, results=["v"] * len(latencies), errors=["boom"] * errors, wall_s=wall)


def _round(drv: float, raw: float, cpu_drv: float, cpu_raw: float) -> dict[str, Any]:
    return {
        "driver_create": _batch([drv, drv], 2 * drv), "driver_delete": _batch([2 * drv], 2 * drv),
        "raw_create": _batch([raw, raw], 2 * raw), "raw_remove": _batch([4 * raw], 4 * raw),
        "raw_trash_remove": _batch([3 * raw], 3 * raw), "raw_trash_mgr": _batch([raw], raw),
        "driver_cpu_create": cpu_drv, "driver_cpu_delete": 2 * cpu_drv, "raw_cpu_create": cpu_raw,
        "raw_cpu_mgr": cpu_raw, "drain_driver_s": 0.5, "drain_raw_s": 0.25,
    }


def test_controller_aggregate_pools_latencies_and_takes_ratios_per_round() -> None:
    rounds = [_round(0.006, 0.005, 4.0, 3.0), _round(0.009, 0.005, 6.0, 3.0), _round(0.007, 0.005, 5.0, 3.0)]
    rounds[1]["driver_create"].errors.append("RpcError: boom")
    level = controller_ops.aggregate(rounds, c=1)
    r = level["ratios"]
    assert r["create_p50"].median == pytest.approx(1.4) and r["create_p50"].low == pytest.approx(1.2)
    assert r["create_p50"].high == pytest.approx(1.8)
    assert r["create_ops"].median == pytest.approx(0.005 / 0.007)
    assert r["cpu_create"].median == pytest.approx(5 / 3)
    assert r["delete_p50_raw_trash_mgr"].median == pytest.approx(2.8)
    assert level["summaries"]["driver_create"].count == 6 and level["summaries"]["driver_create"].errors == 1
    assert level["errors"] == {"driver_create": ["RpcError: boom"]}
    assert level["cpu_ms_per_op"]["driver_cpu_create"].median == 5.0
    doc = controller_ops._json(level)
    assert doc["ratios"]["create_p50"]["n"] == 3 and doc["driver_create"]["count"] == 6

    table = controller_ops.target_rows([({"load": "no added load"}, [level])])
    assert table.columns == ["target", "no added load"]
    assert table.rows[0][1] == "1.40× (1.20–1.80) met, spread crosses"
    assert table.rows[1][1] == "— (not measured)"  # no c=32 level in this pass


def test_the_in_process_path_gets_its_own_ratios_rows_and_targets() -> None:
    from bench.options import Options

    class Env:
        options = Options(ops=6, rounds=3)

    rounds = [_round(0.006, 0.005, 4.0, 3.0), _round(0.009, 0.005, 6.0, 3.0)]
    for one, embedded in zip(rounds, (0.0055, 0.0065)):
        one.update({"embedded_create": _batch([embedded, embedded], 2 * embedded),
                    "embedded_delete": _batch([2 * embedded], 2 * embedded),
                    "embedded_cpu_create": 3.3, "embedded_cpu_delete": 6.0, "drain_embedded_s": 0.4})
    level = controller_ops.aggregate(rounds, c=1)
    r = level["ratios"]
    assert r["embedded_create_p50"].low == pytest.approx(1.1) and r["embedded_create_p50"].high == pytest.approx(1.3)
    assert r["embedded_cpu_create"].median == pytest.approx(1.1)
    assert r["embedded_delete_p50_raw_trash_mgr"].high == pytest.approx(2.6)
    assert r["create_p50"].high == pytest.approx(1.8), "the gRPC path's ratios are unchanged"
    state = {"load": "no added load", "loadavg_start": "0", "loadavg_end": "0", "cpu_busy": "1%"}
    latency, cpu = controller_ops._tables([level], Env(), state)  # type: ignore[arg-type]
    assert [row[1] for row in latency.rows][-2:] == ["create, in-process", "delete, in-process"]
    assert cpu.rows[0][-3] == "1.10× (1.10–1.10)"
    targets = controller_ops.target_rows([({"load": "no added load"}, [level])])
    assert [row[0] for row in targets.rows][4].startswith("CreateVolume p50 ≤ 1.5× RBD.create, c=1, in-process")
    assert targets.rows[4][1] == "1.10× (1.10–1.30) met"


def test_controller_tables_quote_the_machine_state() -> None:
    from bench.options import Options

    class Env:
        options = Options(ops=6, rounds=3)

    level = controller_ops.aggregate([_round(0.006, 0.005, 4.0, 3.0)], c=1)
    state = {"load": "+1 CPU-busy process", "loadavg_start": "1.0 1.0 1.0", "loadavg_end": "2.0 1.5 1.1",
             "cpu_busy": "97%"}
    latency, cpu = controller_ops._tables([level], Env(), state)  # type: ignore[arg-type]
    assert "+1 CPU-busy process" in latency.title and "1.0 1.0 1.0 → 2.0 1.5 1.1" in latency.title
    assert "3 interleaved rounds × 2 ops" in latency.title
    assert [row[5] for row in latency.rows] == ["RBD.create", "RBD.remove", "trash_move+trash_remove",
                                                "trash_move+mgr purge"]
    assert cpu.rows[0][3] == "1.33× (1.33–1.33)"


def test_node_step_ratios_pair_cycle_i_with_cycle_i() -> None:
    d = Timings(stage=[0.05, 0.06], publish=[0.004, 0.006], unpublish=[0.004, 0.004], unstage=[0.07, 0.08])
    m = Timings(stage=[0.05, 0.05], publish=[0.002, 0.002], unpublish=[0.002, 0.002], unstage=[0.03, 0.04])
    ratios = node_ops.step_ratios({"ext4": {"driver": d, "manual": m}, "block": {"driver": d, "manual": m}})
    publish = ratios[("ext4", "  publish")]
    assert publish is not None and (publish.low, publish.high) == (2.0, 3.0)
    down = ratios[("block", "unpublish+unstage")]
    assert down is not None and down.median == pytest.approx(0.084 / 0.042) and down.high == pytest.approx(0.074 / 0.032)


def test_background_levels_and_labels() -> None:
    assert background.parse_levels("0,1,1") == (0, 1)
    with pytest.raises(ValueError):
        background.parse_levels("-1")
    with pytest.raises(ValueError):
        background.parse_levels("x")
    assert background.label(0) == "no added load"
    assert background.label(1) == "+1 CPU-busy process" and background.label(2).endswith("processes")


def test_cpu_hogs_run_and_are_stopped() -> None:
    with background.cpu_hogs(1, settle_s=0.2) as pids:
        assert len(pids) == 1
        os.kill(pids[0], 0)  # alive
        before = machine.cpu_now()
        time.sleep(0.3)
        busy = machine.busy_fraction(before, machine.cpu_now())
        assert busy is not None and busy > 0
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)
    with background.cpu_hogs(0) as none:
        assert none == []


def test_passes_record_the_machine_state_for_each_level() -> None:
    seen = []
    states = []
    for hogs, state in background.passes((0,)):
        seen.append(hogs)
        states.append(state)
    assert seen == [0]
    assert set(states[0]) == {"load", "loadavg_start", "loadavg_end", "cpu_busy"}


def test_cpu_jiffies_parse() -> None:
    text = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n"
    assert machine.cpu_jiffies(text) == (150, 1000)
    assert machine.cpu_jiffies("") == (0, 0)
    assert machine.busy_fraction((0, 0), (50, 100)) == 0.5
    assert machine.busy_fraction((0, 0), (0, 0)) is None


def test_a_round_keeps_every_concurrency_level_busy_for_ten_waves() -> None:
    """20 calls at concurrency 32 would all start at once: the round's ops/s would be its
    slowest call's, not a throughput; and a round of a few waves is over before one stall of the
    cluster averages out."""
    assert load.ops_per_round(100, 5, 1) == 20
    assert load.ops_per_round(100, 5, 8) == 80
    assert load.ops_per_round(100, 5, 32) == 320
    assert load.ops_per_round(8, 2, 1) == 10
    assert load.ops_per_round(2000, 5, 32) == 400
