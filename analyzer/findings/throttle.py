"""Why a GPU ran slow: NVML's clock-throttle ("clocks event") reasons, sampled with the clocks.

The sampler records the reason bitmask next to the SM clock at its fast rate
(`clock_throttle_reasons` in hardware.parquet, collector/hardware.py). A finding that blames
a rank's GPU (`gpu_hardware`) is worth more with the reason: a thermal slowdown calls for the
node's cooling, a power cap for its power limit or supply, and neither is the code. Only the
flagged ranks' hardware.parquet files are read, after the comparison, so a capture of many
workers costs a few reads.

Shares are over the samples where the GPU was busy (the idle bit clear): an idle GPU lowers its
clock by design, which says nothing about the hardware.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfdiag.analyzer.findings.reported import Reported
from perfdiag.api.verdict import Finding

METRIC = "clock_throttle_reasons"
IDLE_BIT = 0x1
MIN_BUSY_SAMPLES = 3
MIN_SHARE = 0.05
"""A reason set in fewer of the busy samples than this is not worth naming."""


@dataclass(frozen=True)
class Reason:
    bit: int
    key: str
    text: str
    cause: str


# NVML's nvmlClocksEventReasons bits (nvml.h); the idle bit only selects the samples.
REASONS: tuple[Reason, ...] = (
    Reason(0x2, "applications_clocks", "application clocks setting", "clocks"),
    Reason(0x4, "sw_power_cap", "software power cap", "power"),
    Reason(0x8, "hw_slowdown", "hardware slowdown (thermal or power brake)", "hardware"),
    Reason(0x10, "sync_boost", "sync boost (held to the slowest GPU of its group)", "clocks"),
    Reason(0x20, "sw_thermal_slowdown", "software thermal slowdown", "thermal"),
    Reason(0x40, "hw_thermal_slowdown", "hardware thermal slowdown", "thermal"),
    Reason(0x80, "hw_power_brake_slowdown", "hardware power brake", "power"),
    Reason(0x100, "display_clocks", "display clock setting", "clocks"),
)

NEXT_STEP_OF_CAUSE = {
    "thermal": "the GPU is too hot: check its temperature, fans and the node's airflow "
    "(nvidia-smi -q -d TEMPERATURE,PERFORMANCE); drain the node if it persists",
    "power": "the GPU is held at its power limit: check the limit and the draw against its "
    "peers' (nvidia-smi -q -d POWER,PERFORMANCE), and the node's power supply for a brake",
    "hardware": "the GPU's hardware slowdown is engaged (an external thermal or power-brake "
    "signal): check the node's power supply and cooling; drain the node if it persists",
    "clocks": "its clocks are held by a setting: compare application clocks and sync-boost "
    "groups with its peers' (nvidia-smi -q -d CLOCK,PERFORMANCE)",
}

GENERIC_HW_SLOWDOWN = "hw_slowdown"

HardwareReader = Callable[[int], pa.Table | None]
"""Rank → its hardware.parquet table, or None when the capture has none for it."""


@dataclass(frozen=True)
class Throttle:
    busy_samples: int
    shares: dict[str, float]
    """Reason key → share of the busy samples it was set in (only those ≥ MIN_SHARE)."""

    @property
    def cause(self) -> str | None:
        """The cause of the reason seen most often; NVML sets the generic hardware slowdown
        bit along with the hardware thermal or power-brake bit, and the specific one wins."""
        if not self.shares:
            return None
        specific = [key for key in self.shares if key != GENERIC_HW_SLOWDOWN]
        top = max(specific or list(self.shares), key=lambda key: self.shares[key])
        return next(r.cause for r in REASONS if r.key == top)

    def describe(self) -> str:
        texts = {r.key: r.text for r in REASONS}
        ranked = sorted(
            self.shares.items(), key=lambda item: (-item[1], item[0] == GENERIC_HW_SLOWDOWN)
        )
        return ", ".join(f"{texts[key]} in {share:.0%}" for key, share in ranked)


def throttle_of(hardware: pa.Table) -> Throttle | None:
    """The reasons a worker's GPU was throttled while busy; None without reason samples."""
    rows = hardware.filter(pc.equal(hardware.column("metric"), METRIC))
    if rows.num_rows == 0:
        return None
    values = rows.column("value").to_numpy(zero_copy_only=False)
    masks = values[np.isfinite(values)].astype(np.int64)
    busy = masks[(masks & IDLE_BIT) == 0]
    if len(busy) < MIN_BUSY_SAMPLES:
        return None
    shares = {r.key: float(np.mean((busy & r.bit) != 0)) for r in REASONS}
    return Throttle(len(busy), {k: round(v, 4) for k, v in shares.items() if v >= MIN_SHARE})


def with_throttle_reasons(
    reported: list[Reported], read_hardware: HardwareReader | None
) -> list[Reported]:
    """`gpu_hardware` findings with their ranks' throttle reasons in the evidence and the
    message (the next step becomes the one for that cause)."""
    if read_hardware is None:
        return reported
    cache: dict[int, Throttle | None] = {}

    def throttle(rank: int) -> Throttle | None:
        if rank not in cache:
            table = read_hardware(rank)
            cache[rank] = throttle_of(table) if table is not None else None
        return cache[rank]

    out = []
    for item in reported:
        finding = item.finding
        if finding.category != "gpu_hardware":
            out.append(item)
            continue
        found = {rank: t for rank in finding.ranks if (t := throttle(rank)) is not None}
        if not found:
            out.append(item)
            continue
        out.append(Reported(_annotated(finding, found), item.headline))
    return out


def _annotated(finding: Finding, found: Mapping[int, Throttle]) -> Finding:
    evidence = {
        **finding.evidence,
        "throttle_reasons": {
            str(rank): {"busy_samples": t.busy_samples, "shares": t.shares}
            for rank, t in sorted(found.items())
        },
    }
    named = {rank: t for rank, t in found.items() if t.shares}
    if not named:
        said = "NVML reported no clock-throttle reason while it was busy."
        return finding.model_copy(
            update={"evidence": evidence, "message": f"{finding.message} {said}"}
        )
    parts = [
        f"rank {rank}: {t.describe()} of its busy samples" for rank, t in sorted(named.items())
    ]
    causes = [t.cause for t in named.values() if t.cause is not None]
    cause = max(sorted(set(causes)), key=causes.count)  # sorted: ties resolve the same way
    # The generic next step ("check clocks, thermals, power…") gives way to the cause's.
    head, _, _ = finding.message.partition(" Next: ")
    message = (
        f"{head} Clock-throttle reasons (NVML): {'; '.join(parts)}. "
        f"Next: {NEXT_STEP_OF_CAUSE[cause]}."
    )
    return finding.model_copy(update={"evidence": evidence, "message": message})
