"""What the fusion (analyzer/findings/fusion.py) says of a rank slower than its peers: the
functions and categories that hold its excess, its cause, and the ranks that wait for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from perfdiag.analyzer.compare.features import Features
from perfdiag.analyzer.compare.outliers import Deviations
from perfdiag.analyzer.signals.cpu_cause import CpuCause
from perfdiag.analyzer.signals.hardware import ResourceAnomaly

ExcessBasis = Literal["total", "outlying", "cpu"]


@dataclass(frozen=True)
class Contributor:
    function: str | None
    category: str
    ms: float
    peers_ms: float
    best_peer_ms: float
    excess_ms: float
    beta: float
    peers_beta: float
    robust_z: float
    ratio: float
    steps_outlying: int
    steps: int
    outlying: bool

    def evidence(self) -> dict[str, object]:
        return {
            "function": self.function,
            "category": self.category,
            "beta": round(self.beta, 4),
            "peers_median_beta": round(self.peers_beta, 4),
            "ms_per_step": round(self.ms, 3),
            "peers_median_ms_per_step": round(self.peers_ms, 3),
            "best_peer_ms_per_step": round(self.best_peer_ms, 3),
            "excess_ms_per_step": round(self.excess_ms, 3),
            "robust_z": _finite(self.robust_z),
            "ratio_to_peers": _finite(self.ratio),
            "steps_outlying": self.steps_outlying if self.steps_outlying >= 0 else None,
            "steps": self.steps,
            "outlying": self.outlying,
        }


def contributor(features: Features, dev: Deviations, i: int, k: int) -> Contributor:
    """Feature `k` of rank `i` against its peers."""
    step = float(features.mean_step_ms[i])
    ref = float(dev.ref[i, k])
    return Contributor(
        function=features.functions[k],
        category=features.categories[k],
        ms=float(features.ms[i, k]),
        peers_ms=ref,
        best_peer_ms=float(dev.best[i, k]),
        excess_ms=float(dev.excess_ms[i, k]),
        beta=float(features.ms[i, k] / step) if step else 0.0,
        peers_beta=ref / step if step else 0.0,
        robust_z=float(dev.z[i, k]),
        ratio=float(dev.ratio[i, k]),
        steps_outlying=int(dev.steps_outlying[i, k]),
        steps=int(dev.steps_valid[i, k]) or int(features.steps.counts[i]),
        outlying=bool(dev.outlying[i, k]),
    )


def _finite(x: float) -> float | None:
    return round(float(x), 3) if np.isfinite(x) else None


@dataclass(frozen=True)
class Victims:
    ranks: list[int]
    wait_ms: float
    """Median extra communication time of the victims over the culprit, ms/step."""
    function: str | None
    """The communication function they wait in most."""


@dataclass(frozen=True)
class SlowWorker:
    rank: int
    position: int
    group: int
    step_ms: float
    excess_ms: float
    non_wait_ms: float
    peers_non_wait_ms: float
    steps_outlying: int
    steps: int
    peer_count: int
    contributors: list[Contributor]
    categories: list[Contributor]
    root_category: str
    root_basis: str
    hardware: ResourceAnomaly | None = None
    victims: Victims | None = None
    cpu: CpuCause | None = None
    """What the rank did with its time, against its peers (HostUsage)."""
    intermittent: bool = False
    """Its excess recurs in some steps rather than in most."""
    excess_basis: ExcessBasis = "total"
    """How `excess_ms` was measured: its whole time outside communication against its peers'
    ("total"), the functions and categories that stand out ("outlying"), or its own extra
    computation by the CPU accounting ("cpu")."""
    mean_step_ms: float = 0.0
    """The rank's mean step over the window; `step_ms` is it, or the median step that a
    throttled rank's severity is a share of."""
    user_function: str | None = None
    """The user's own frame behind the top contributor (analyzer/signals/user_frame.py), when that
    contributor is a builtin, a library frame or an op."""
    user_callers: tuple[str, ...] = ()
    """The user's frames around `user_function` that hold the excess too, outermost first."""
    cause_function: str | None = None
    """A call that sets the rank apart though little of its excess is its own time: a host-GPU
    synchronization its peers do not make (analyzer/findings/naming.py)."""

    @property
    def function(self) -> str | None:
        """The function the finding names: the call that sets it apart, else the user's frame
        where known."""
        if self.cause_function is not None:
            return self.cause_function
        if self.user_function is not None:
            return self.user_function
        if self.cpu is not None and self.cpu.kind in ("threads", "throttled", "starved"):
            return None  # the host or other threads: no function of the training thread
        return self.top.function if self.top else None

    @property
    def severity(self) -> float:
        return float(min(1.0, max(0.0, self.excess_ms / self.step_ms))) if self.step_ms else 0.0

    @property
    def top(self) -> Contributor | None:
        return self.contributors[0] if self.contributors else None

    @property
    def own_excess_ms(self) -> float:
        """Its time outside communication less its peers' median, ms/step: wall time, as its
        functions' times are measured."""
        return self.non_wait_ms - self.peers_non_wait_ms
