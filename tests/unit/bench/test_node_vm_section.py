"""Section 2b's pure parts: the by-hand scripts' output, the accelerator label, per-cycle ratios."""
from __future__ import annotations

import pytest

from bench.sections import by_name
from bench.sections.node_ops import Timings
from bench.sections.node_vm import (
    NAME,
    accelerator_label,
    manual_down_script,
    manual_up_script,
    parse_down,
    parse_up,
    ratios,
)

pytestmark = pytest.mark.unit


def test_parses_the_guest_timings_in_nanoseconds() -> None:
    assert parse_up("noise\n/dev/rbd0 2500000000 40000000\n") == ("/dev/rbd0", 2.5, 0.04)
    assert parse_down("12000000 3000000000") == (0.012, 3.0)


@pytest.mark.parametrize("text", ["", "rbd: map failed", "/dev/rbd0 12", "x 1 2"])
def test_unexpected_stage_output_is_an_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_up(text or "\n")


def test_tcg_is_labelled_ratios_only() -> None:
    assert accelerator_label("kvm") == "KVM"
    assert accelerator_label("tcg").startswith("TCG") and "ratios only" in accelerator_label("tcg")


def test_scripts_map_with_the_key_file_and_unmap_the_same_type() -> None:
    up = manual_up_script("nbd", "rbd/img", "ext4", "/st", "/tg", "csi", "10.0.0.1:3300", "/run/k")
    assert "--device-type nbd" in up and "--keyfile /run/k" in up and "mkfs.ext4" in up
    block = manual_up_script("krbd", "rbd/img", "block", "/st", "/tg", "csi", "m", "/run/k")
    assert "mkfs" not in block and "mount --bind \"$dev\" /st/block" in block
    down = manual_down_script("nbd", "/dev/nbd0", "ext4", "/st", "/tg")
    assert down.index("umount /tg") < down.index("umount /st/fs") < down.index("unmap --device-type nbd /dev/nbd0")


def test_ratios_pair_cycle_i_of_the_driver_with_cycle_i_by_hand() -> None:
    driver, manual = Timings([2.0, 3.0], [0.1, 0.1], [0.1, 0.1], [1.0, 4.0]), Timings([1.0, 1.0], [0.1, 0.1],
                                                                                   [0.1, 0.1], [1.0, 1.0])
    spreads = ratios({("krbd", "ext4"): {"driver": driver, "manual": manual}})
    up = spreads[("krbd", "ext4", "stage+publish")]
    assert up is not None and (up.low, up.high) == pytest.approx((2.1 / 1.1, 3.1 / 1.1))
    down = spreads[("krbd", "ext4", "unpublish+unstage")]
    assert down is not None and down.high == pytest.approx(4.1 / 1.1)


def test_selectable_as_its_own_section() -> None:
    assert NAME in by_name()


def test_exclusive_row_maps_by_hand_with_the_option() -> None:
    up = manual_up_script("nbd", "rbd/img", "block", "/st", "/tg", "csi", "m", "/run/k", "exclusive")
    assert "-o exclusive rbd/img" in up
    assert "-o " not in manual_up_script("nbd", "rbd/img", "block", "/st", "/tg", "csi", "m", "/run/k")
