"""`python -m bench`: start the real Ceph test cluster, run the sections, print the table and
write bench/results/bench-<UTC time>.{json,txt,md} (and latest.*)."""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import background, machine, report
from bench.environment import Environment
from bench.model import SectionResult
from bench.options import GiB, QUICK, RESULTS_DIR, Options
from bench.sections import SECTIONS, by_name

log = logging.getLogger("bench")


def _levels(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of integers") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: concurrency levels must be ≥ 1")
    return values


def _loads(text: str) -> tuple[int, ...]:
    try:
        return background.parse_levels(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def build_parser() -> argparse.ArgumentParser:
    names = [s.name for s in SECTIONS]
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true",
                   help=f"a fast check that everything runs (defaults become {QUICK})")
    p.add_argument("--ops", type=int, help="operations per batch (default 100; quick 8)")
    p.add_argument("--rounds", type=int, help="interleaved driver/baseline rounds per comparison (default 5; quick 2)")
    p.add_argument("--background-load", type=_loads, default=None,
                   help="comma list of CPU-busy processes to add, one pass of the controller, node and snapshots sections "
                        "each (default 0: none; '0,1' = quiet pass, then a pass with one busy process)")
    p.add_argument("--concurrency", type=_levels, help="comma list of in-flight levels (default 1,8,32)")
    p.add_argument("--size-mib", type=int, default=GiB >> 20, help="image/volume size in MiB (default %(default)s, thin)")
    p.add_argument("--warmup", type=int, help="untimed create/delete pairs per path first (default 4)")
    p.add_argument("--node-iterations", type=int, help="stage/unstage cycles per path and mode (default 8)")
    p.add_argument("--node-volumes", type=int,
                   help="volumes staged and published at once on one node plugin in section 2c (default 100; quick 10)")
    p.add_argument("--sidecar-settle", type=float, help="seconds each Go sidecar runs before its RSS is read (default 10)")
    p.add_argument("--pvc-burst", type=int, help="PVCs created at once in 4a (default 100; quick 10)")
    p.add_argument("--pvc-repeats", type=int, help="single-PVC create→Bound repeats in 4a (default 5; quick 2)")
    p.add_argument("--failover-graceful", type=int, help="SIGTERM failovers in 4b (default 3; quick 1)")
    p.add_argument("--failover-kill", type=int, help="SIGKILL failovers in 4b (default 2; quick 1)")
    p.add_argument("--scale-claims", type=int, help="bound claims seeded by section 5 (default 5000; quick 200)")
    p.add_argument("--scale-idle", type=float, help="seconds each side idles after sync in section 5 (default 60; quick 5)")
    p.add_argument("--scale-rounds", type=int, help="interleaved cephcsi/Go starts per size in section 5 (default 2)")
    p.add_argument("--sections", default="", help=f"comma list to run (default all): {', '.join(names)}")
    p.add_argument("--profile", nargs="?", const="running", choices=("running", "gil"), default="",
                   help="record the controller with py-spy during section 1's first pass (profile-*.txt in the "
                        "output dir; perturbs the figures, so use a separate run): 'running' samples every "
                        "thread that is not waiting (Python and librbd/librados CPU), 'gil' only threads "
                        "holding the GIL (the Python interpreter's own cost)")
    p.add_argument("--no-build", action="store_true", help="use only already-built Go sidecars / control plane")
    p.add_argument("--output-dir", type=Path, default=RESULTS_DIR, help="where results go (default %(default)s)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def options_from(args: argparse.Namespace) -> Options:
    base = dataclasses.replace(Options(), **QUICK, quick=True) if args.quick else Options()
    chosen = tuple(x.strip() for x in args.sections.split(",") if x.strip())
    unknown = [x for x in chosen if x not in by_name()]
    if unknown:
        raise SystemExit(f"bench: unknown section(s) {', '.join(unknown)}; choose from {', '.join(by_name())}")
    changes: dict[str, Any] = {
        "ops": args.ops, "rounds": args.rounds, "background_loads": args.background_load,
        "concurrency": args.concurrency, "warmup": args.warmup,
        "node_iterations": args.node_iterations, "sidecar_settle_s": args.sidecar_settle,
        "pvc_burst": args.pvc_burst, "pvc_repeats": args.pvc_repeats,
        "failover_graceful": args.failover_graceful, "failover_kill": args.failover_kill,
        "scale_claims": args.scale_claims, "scale_idle_s": args.scale_idle, "scale_rounds": args.scale_rounds,
    }
    if args.scale_claims is not None and args.scale_claims < 1:
        raise SystemExit("bench: --scale-claims must be ≥ 1")
    if args.scale_rounds is not None and args.scale_rounds < 1:
        raise SystemExit("bench: --scale-rounds must be ≥ 1")
    if args.node_volumes is not None and args.node_volumes < 1:
        raise SystemExit("bench: --node-volumes must be ≥ 1")
    if args.rounds is not None and args.rounds < 1:
        raise SystemExit("bench: --rounds must be ≥ 1")
    return dataclasses.replace(
        base,
        **{k: v for k, v in changes.items() if v is not None},
        size_bytes=args.size_mib << 20,
        sections=chosen,
        build=not args.no_build,
        profile=args.profile,
        output_dir=args.output_dir,
        extra={**base.extra, **({} if args.node_volumes is None else {"node_volumes": args.node_volumes})},
    )


def run_sections(env: Environment) -> list[SectionResult]:
    results = []
    for section in SECTIONS:
        if env.options.sections and section.name not in env.options.sections:
            continue
        log.info("section %s: %s", section.name, section.title)
        started = time.monotonic()
        try:
            result = section.run(env)
        except Exception as error:  # noqa: BLE001 - one broken section must not lose the others
            log.error("section %s failed:\n%s", section.name, traceback.format_exc())
            result = SectionResult(name=section.name, title=section.title, status="failed",
                                   reason=f"{type(error).__name__}: {str(error)[:500]}")
        result.seconds = time.monotonic() - started
        results.append(result)
        print(report.format_text([result], {}).split("\n", 2)[-1], flush=True)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options = options_from(args)
    info = machine.collect()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    started = time.monotonic()
    with Environment(options) as env:
        env.start_cluster()
        info["ceph_cluster_versions"] = env.ceph_versions
        results = run_sections(env)
    info["loadavg_end"] = machine.loadavg()
    info["total_seconds"] = round(time.monotonic() - started, 1)
    text = report.format_text(results, info)
    markdown = report.format_markdown(results, info)
    path = report.write_outputs(options.output_dir, stamp, report.document(results, info, options.to_json()),
                                text, markdown)
    print("\n" + text)
    print(f"results: {path} (and latest.json/.txt/.md beside it)")
    return 1 if any(r.status == "failed" for r in results) else 0
