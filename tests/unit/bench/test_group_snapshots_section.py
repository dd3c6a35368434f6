"""Section 8's table: one driver figure per member count against each of its floors, ratios per
round, and a row left out where a side never measured it."""
from __future__ import annotations

import pytest

from bench.sections import group_snapshots
from bench.sections.group_snapshots import Rounds, key

pytestmark = pytest.mark.unit


def rounds() -> Rounds:
    return [
        {"driver": {key("full", 2): [0.40], key("instant", 2): [0.40], key("delete", 2): [0.20]},
         "raw": {key("full", 2): [0.40], key("instant", 2): [0.10], key("delete", 2): [0.25]}},
        {"driver": {key("full", 2): [0.60], key("instant", 2): [0.60], key("delete", 2): [0.30]},
         "raw": {key("full", 2): [0.50], key("instant", 2): [0.20], key("delete", 2): [0.30]}},
    ]


def test_each_member_count_has_a_row_per_floor_with_per_round_ratios() -> None:
    table = group_snapshots.driver_table(rounds(), (2,), 1)
    assert [row[:2] for row in table.rows] == [["2", "CreateVolumeGroupSnapshot"], ["2", "CreateVolumeGroupSnapshot"],
                                               ["2", "DeleteVolumeGroupSnapshot"]]
    full, instant, delete = table.rows
    assert full[4] == group_snapshots.BASELINES["full"] and full[7] == "1.00× (1.00–1.20)"
    assert instant[4] == group_snapshots.BASELINES["instant"] and instant[7] == "3.00× (3.00–4.00)"
    assert delete[5] == "250.0" and delete[7] == "0.80× (0.80–1.00)"


def test_a_member_count_never_measured_is_left_out() -> None:
    assert group_snapshots.driver_table(rounds(), (2, 32), 1).rows[3:] == []
