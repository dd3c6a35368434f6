"""Benchmark options (the CLI fills them; sections read them)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

GiB = 1 << 30
RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Options:
    ops: int = 100
    """Operations per batch (per concurrency level and per kind); 100 makes the nearest-rank p99
    the second-largest sample rather than the maximum."""
    rounds: int = 5
    """Each comparison runs in this many interleaved rounds (driver, baseline, driver, ...), each
    with ops/rounds operations per side; ratios are reported as the median over rounds with
    their min–max, latencies pooled over all rounds."""
    background_loads: tuple[int, ...] = (0,)
    """Passes of the controller, node and snapshots sections, each with this many CPU-busy processes
    started by the bench (0: none added): `--background-load 0,1` shows how the ratios move."""
    concurrency: tuple[int, ...] = (1, 8, 32)
    size_bytes: int = GiB
    """Size of every image/volume (thin: nothing is written)."""
    warmup: int = 4
    """Untimed create+delete pairs per path before measuring (connections, caches)."""
    node_iterations: int = 8
    """Stage/publish/unpublish/unstage cycles per path and volume mode."""
    sidecar_settle_s: float = 10.0
    """Seconds a Go sidecar runs before its RSS is read."""
    pvc_burst: int = 100
    """PVCs created at once in 4a (and raw creates / static PVs in its floors)."""
    pvc_repeats: int = 5
    """Single-PVC create → Bound repeats in 4a."""
    failover_graceful: int = 3
    """SIGTERM failovers in 4b."""
    failover_kill: int = 2
    """SIGKILL failovers in 4b (each waits out the 15 s lease)."""
    scale_claims: int = 5000
    """Bound claims (PVC + PV + attached VolumeAttachment each) the scale section seeds."""
    scale_idle_s: float = 60.0
    """Seconds each side of the scale section idles after its informers synced before /proc is read."""
    scale_rounds: int = 2
    """Interleaved cephcsi / Go stack starts per cluster size in the scale section."""
    drain_timeout_s: float = 300.0
    """Longest wait for the mgr to purge the trash between batches."""
    profile: str = ""
    """'running' or 'gil': record the controller with py-spy during section 1's first pass (a
    separate run: the sampling perturbs the figures); collapsed stacks + summary in output_dir."""
    build: bool = True
    """Build missing Go sidecars / control-plane binaries (slow once; cached after)."""
    sections: tuple[str, ...] = ()
    """Sections to run (empty: all)."""
    output_dir: Path = RESULTS_DIR
    quick: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["output_dir"] = str(self.output_dir)
        doc["concurrency"] = list(self.concurrency)
        doc["background_loads"] = list(self.background_loads)
        doc["sections"] = list(self.sections)
        return doc


QUICK: dict[str, Any] = {"ops": 8, "rounds": 2, "concurrency": (1, 8), "warmup": 1, "node_iterations": 1, "sidecar_settle_s": 3.0,
                         "pvc_burst": 10, "pvc_repeats": 2, "failover_graceful": 1, "failover_kill": 1,
                         "scale_claims": 200, "scale_idle_s": 5.0}
