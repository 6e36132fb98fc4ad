"""The synthetic GPU fault matrix (docs/analysis.md): each fault of
perfdiag_testing.synthetic_trace, injected on one rank of an 8-rank job, with the culprit and
category the analysis must name. tests/analyzer/test_fault_matrix.py asserts it;
benchmarks/fault_matrix.py prints it as the docs' table."""

from __future__ import annotations

from dataclasses import dataclass

from perfdiag_testing.synthetic_trace import TraceFault, TraceJob

CULPRIT = 5
RANKS = 8


@dataclass(frozen=True)
class Scenario:
    name: str
    job: TraceJob
    culprit: int | None
    """None: no finding expected."""
    category: str | None
    function: str | None = None
    """Substring the top finding's function must contain (None: not checked)."""


def scenarios(seed: int = 0) -> list[Scenario]:
    def job(*faults: TraceFault, **kwargs: object) -> TraceJob:
        return TraceJob(n_ranks=RANKS, seed=seed, faults=list(faults), **kwargs)  # type: ignore[arg-type]

    on = (CULPRIT,)
    return [
        Scenario("healthy", job(), None, None),
        Scenario("throttled GPU (kernels ×1.3)", job(TraceFault("throttled_gpu", on, factor=1.3)),
                 CULPRIT, "gpu_hardware"),
        Scenario("throttled GPU (kernels ×1.6)", job(TraceFault("throttled_gpu", on, factor=1.6)),
                 CULPRIT, "gpu_hardware"),
        Scenario("slow link (transfers ×3)", job(TraceFault("slow_link", on, factor=3.0)),
                 CULPRIT, "network"),
        Scenario("compute straggler (attention ×2)",
                 job(TraceFault("compute_straggler", on, factor=2.0)), CULPRIT, "gpu_compute",
                 "flash_"),
        Scenario("Python hotspot (+4 ms/step)",
                 job(TraceFault("python_hotspot", on, extra_ms=4.0)), CULPRIT, "python",
                 "tokenize"),
        Scenario("host-bound launches (+0.6 ms per launch)",
                 job(TraceFault("launch_gaps", on, extra_ms=0.6)), CULPRIT, "cuda_runtime",
                 "cudaLaunchKernel"),
        Scenario("memcpy anomaly (HtoD ×15)",
                 job(TraceFault("memcpy_anomaly", on, factor=15.0)), CULPRIT, "gpu_memory",
                 "Memcpy HtoD"),
        Scenario("imbalanced pipeline (4 stages, last has 10 layers vs 6)",
                 job(pipeline_stages=4, stage_layers=(6, 6, 6, 10)), None, None),
    ]  # fmt: skip
