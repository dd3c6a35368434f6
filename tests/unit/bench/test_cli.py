"""The bench's command line and section list (no peers started)."""
from __future__ import annotations

import pytest

from bench.cli import build_parser, options_from
from bench.options import GiB, Options
from bench.sections import SECTIONS, by_name

pytestmark = pytest.mark.unit


def _options(*argv: str) -> Options:
    return options_from(build_parser().parse_args(list(argv)))


def test_defaults_and_quick() -> None:
    full = _options()
    assert (full.ops, full.concurrency, full.size_bytes, full.quick) == (100, (1, 8, 32), GiB, False)
    quick = _options("--quick")
    assert quick.quick and quick.ops < full.ops and quick.node_iterations < full.node_iterations


def test_flags_override_quick_and_sections_are_checked() -> None:
    o = _options("--quick", "--ops", "5", "--concurrency", "2,4", "--size-mib", "64", "--sections", "controller,node",
                 "--no-build")
    assert (o.ops, o.concurrency, o.size_bytes, o.sections, o.build) == (5, (2, 4), 64 << 20, ("controller", "node"), False)
    with pytest.raises(SystemExit):
        _options("--sections", "nope")
    with pytest.raises(SystemExit):
        _options("--concurrency", "0")
    assert o.to_json()["concurrency"] == [2, 4]


def test_section_names_are_unique_and_the_kube_sections_run_after_the_sidecars() -> None:
    names = [s.name for s in SECTIONS]
    assert len(names) == len(set(names)) == len(by_name())
    assert names.index("controller") < names.index("resources") < names.index("sidecars")
    # 4a reads 3b's Go sidecar figures from env.shared, so it must come after it.
    assert names.index("sidecars") < names.index("kube-provisioning") < names.index("kube-failover")


def test_kube_options_default_quick_and_flags() -> None:
    full = _options()
    assert (full.pvc_burst, full.pvc_repeats, full.failover_graceful, full.failover_kill) == (100, 5, 3, 2)
    quick = _options("--quick")
    assert 0 < quick.pvc_burst < full.pvc_burst and quick.failover_graceful >= 1 and quick.failover_kill >= 1
    o = _options("--quick", "--pvc-burst", "20", "--pvc-repeats", "3", "--failover-graceful", "2",
                 "--failover-kill", "0")
    assert (o.pvc_burst, o.pvc_repeats, o.failover_graceful, o.failover_kill) == (20, 3, 2, 0)
    assert o.to_json()["pvc_burst"] == 20


def test_rounds_and_background_load_flags() -> None:
    full = _options()
    assert (full.rounds, full.background_loads) == (5, (0,))
    o = _options("--rounds", "3", "--background-load", "0,1")
    assert (o.rounds, o.background_loads) == (3, (0, 1))
    assert o.to_json()["background_loads"] == [0, 1]
    assert _options("--quick").rounds == 2
    with pytest.raises(SystemExit):
        _options("--rounds", "0")
    with pytest.raises(SystemExit):
        _options("--background-load", "-1")
