"""Section 7's figures: pooled percentiles and per-round ratios of interleaved rounds, and the
mapping options' ratios to option (a)."""
from __future__ import annotations

import pytest

from bench.sections import snapshots
from bench.sections.snapshots import Rounds, mapping_figures, row_figures

pytestmark = pytest.mark.unit


def rounds() -> Rounds:
    return [
        {"driver": {"restore|empty 1 GiB": [0.030, 0.020, 0.040]}, "raw": {"restore|empty 1 GiB": [0.010, 0.010, 0.012]},
         "mapping": {"a|snapshot|empty 1 GiB": [0.100], "b|snapshot|empty 1 GiB": [0.050],
                     "a|restore|empty 1 GiB": [0.020], "b|restore|empty 1 GiB": [0.010]}},
        {"driver": {"restore|empty 1 GiB": [0.050]}, "raw": {"restore|empty 1 GiB": [0.020]},
         "mapping": {"a|snapshot|empty 1 GiB": [0.200], "b|snapshot|empty 1 GiB": [0.060],
                     "a|restore|empty 1 GiB": [0.020], "b|restore|empty 1 GiB": [0.030]}},
    ]


def test_row_ratios_are_per_round_medians_and_percentiles_are_pooled() -> None:
    f = row_figures(rounds(), "restore|empty 1 GiB")
    assert f is not None
    assert f["n"] == 4
    assert f["p50"] == 0.030 and f["p99"] == 0.050  # nearest rank over all four samples
    assert f["base_p50"] == 0.010 and f["base_p99"] == 0.020
    ratio = f["ratio"]
    # round 1: median 0.030 / 0.010 = 3.0; round 2: 0.050 / 0.020 = 2.5
    assert ratio.n == 2 and ratio.low == pytest.approx(2.5) and ratio.high == pytest.approx(3.0)
    assert ratio.median == pytest.approx(2.5)  # the lower middle of an even count


def test_a_row_one_side_never_measured_is_left_out() -> None:
    assert row_figures(rounds(), "clone|empty 1 GiB") is None
    assert row_figures([{"driver": {"x": [1.0]}}], "x") is None


def test_mapping_options_are_compared_with_option_a_round_by_round() -> None:
    f = mapping_figures(rounds(), "b", "empty 1 GiB")
    assert f is not None
    assert f["snapshot"]["p50"] == 0.050
    assert f["snapshot"]["vs_a"].low == pytest.approx(0.3) and f["snapshot"]["vs_a"].high == pytest.approx(0.5)
    assert f["restore"]["vs_a"].high == pytest.approx(1.5)
    missing = mapping_figures(rounds(), "d", "empty 1 GiB")
    assert missing is not None and missing["snapshot"]["n"] == 0 and missing["snapshot"]["vs_a"] is None
    assert mapping_figures([], "a", "empty 1 GiB") is None


def test_tables_render_from_rounds_with_op_counts_and_outcomes() -> None:
    state = {"load": "no added load", "loadavg_start": "0.1", "loadavg_end": "0.2", "cpu_busy": "30%"}
    counts = {"driver|restore|empty 1 GiB": {"op": 83.0}, "raw|restore|empty 1 GiB": {"op": 47.0}}
    table = snapshots.driver_table(rounds(), state, counts, 3)
    assert table.rows == [["restore", "empty 1 GiB", "30.0", "50.0", "clone v2 of the restore point", "10.0", "20.0",
                           "2.50× (2.50–3.00)", "83", "47"]]
    assert "30% busy" in table.title
    outcomes = {"b": {"images_per_snapshot": 0, "source_snaps_per_snapshot": 1, "remove_result": "ok",
                      "restore_after": "refused: ImageNotFound", "left_after_cleanup": "nothing"}}
    mapping = snapshots.mapping_table(rounds(), state, counts, outcomes)
    assert [row[0][:3] for row in mapping.rows] == ["(a)", "(b)"]
    assert mapping.rows[1][8:] == ["0", "1"]
    assert snapshots.outcome_table(outcomes).rows[0][2] == "refused: ImageNotFound"
