"""The suspects of one round of fusion (analyzer/findings/fusion.py): the ranks whose time
outside communication stands out from their peers', and the worker record each is judged by."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TypedDict

import numpy as np
from numpy.typing import NDArray

from perfdiag.analyzer.compare.features import (
    LEVEL_CATEGORY,
    LEVEL_FUNCTION,
    Features,
    finding_category,
    is_idle,
)
from perfdiag.analyzer.compare.outliers import Deviations
from perfdiag.analyzer.compare.peers import PeerGroups
from perfdiag.analyzer.findings.slow_worker import SlowWorker, contributor
from perfdiag.analyzer.signals.contention import CpuWait
from perfdiag.analyzer.signals.cpu_cause import CpuWork, PeerCpu, RankCpu, cpu_work_excess
from perfdiag.api.thresholds import Thresholds

TOP_CONTRIBUTORS = 5
UNATTRIBUTED = "time outside any profiled operation"


class RankTimes(TypedDict):
    """What the comparison says of a rank, whatever its SlowWorker record is named for."""

    rank: int
    position: int
    group: int
    mean_step_ms: float
    non_wait_ms: float
    peers_non_wait_ms: float
    peer_count: int


@dataclass(frozen=True, eq=False)
class PeerContext:
    """One round's comparison of the ranks with their peers, and what else judges them."""

    features: Features
    dev: Deviations
    groups: PeerGroups
    thresholds: Thresholds
    reference: NDArray[np.bool_]
    """(R,) the ranks that are a reference for their peers: not those named in an earlier
    round."""
    host: RankCpu | None
    """The ranks' CPU accounting, when every rank has it."""
    cpu: CpuWait | None
    """The older per-function run share, which judges contention without `host`."""

    @cached_property
    def functions(self) -> NDArray[np.bool_]:
        """(K,) the features that are functions outside communication."""
        return self._outside_communication(LEVEL_FUNCTION)

    @cached_property
    def categories(self) -> NDArray[np.bool_]:
        """(K,) the features that are categories outside communication."""
        return self._outside_communication(LEVEL_CATEGORY)

    def _outside_communication(self, level: int) -> NDArray[np.bool_]:
        mask: NDArray[np.bool_] = (self.features.level == level) & ~self.features.waiting
        return mask

    def material_ms(self, i: int) -> float:
        """The least excess that counts for rank i, ms/step."""
        return self.thresholds.min_excess_fraction * float(self.features.mean_step_ms[i])

    def rank_times(self, i: int) -> RankTimes:
        nw = self.features.non_wait_index
        return RankTimes(
            rank=int(self.features.ranks[i]),
            position=i,
            group=int(self.groups.labels[i]),
            mean_step_ms=float(self.features.mean_step_ms[i]),
            non_wait_ms=float(self.features.ms[i, nw]),
            peers_non_wait_ms=float(self.dev.ref[i, nw]),
            peer_count=int(self.dev.peer_count[i]),
        )

    def reference_peers(self, i: int) -> NDArray[np.int64]:
        """Rank i's peer group, without the ranks already named (when that leaves a peer)."""
        peers = self.groups.members(int(self.groups.labels[i]))
        if self.reference[peers].sum() > 1:
            peers = peers[self.reference[peers] | (peers == i)]
        return peers


@dataclass(frozen=True, eq=False)
class Suspect:
    """A rank whose time outside communication stands out from its reference peers'."""

    context: PeerContext
    position: int
    work: CpuWork | None
    """Its extra computation step by step (exact counters), when it computes longer."""

    @cached_property
    def peers(self) -> NDArray[np.int64]:
        """Its reference peers, itself included."""
        return self.context.reference_peers(self.position)

    @property
    def material_ms(self) -> float:
        return self.context.material_ms(self.position)

    @cached_property
    def host(self) -> PeerCpu | None:
        """Its CPU accounting beside its reference peers', when every rank has one."""
        if self.context.host is None:
            return None
        return PeerCpu.of(self.context.host, self.position, self.peers, self.material_ms)


def find_suspects(context: PeerContext) -> list[Suspect]:
    """The ranks that spend materially longer outside communication than their peers, and do
    not merely wait longer in it (a victim of another culprit)."""
    features, dev, thresholds = context.features, context.dev, context.thresholds
    nw, wait = features.non_wait_index, features.wait_index
    functions, categories = context.functions, context.categories
    material = dev.excess_fraction[:, nw] >= thresholds.min_excess_fraction
    outlying_work = dev.outlying & (functions | categories)[None, :]
    waits_more = dev.excess_fraction[:, wait] >= thresholds.min_excess_fraction
    step = features.mean_step_ms
    # Extra work found function by function: on a busy host the non-wait total of every rank
    # is noisy, while a function its peers do not run (or run far less) stands out alone.
    work_excess = np.maximum(
        np.where(outlying_work & functions[None, :], np.maximum(dev.excess_ms, 0), 0).sum(1),
        np.where(outlying_work & categories[None, :], np.maximum(dev.excess_ms, 0), 0).sum(1),
    )
    material_work = work_excess >= thresholds.min_excess_fraction * step
    host = context.host
    if host is not None:
        # Waiting more in communication marks a victim, unless the rank also computes
        # materially longer than its peers (a second culprit waits for the first).
        works_more = host.on_cpu - _group_median(host.on_cpu, context.groups, context.reference)
        waits_more &= ~(works_more >= thresholds.min_excess_fraction * features.mean_step_ms)
    suspected = (material & (dev.outlying[:, nw] | outlying_work.any(axis=1))) | material_work
    computes_more = _computing_longer(context)
    for i in computes_more:
        suspected[i] = True
        # It computes longer step by step: what it waits more is for another culprit.
        waits_more[i] = False
    # Culprits: a handful of ranks, never all of them.
    return [
        Suspect(context, i, computes_more.get(i))
        for i in np.flatnonzero(suspected & ~waits_more).tolist()
    ]


def _computing_longer(context: PeerContext) -> dict[int, CpuWork]:
    """The ranks whose training thread computes longer than their peers' step by step, from
    its exact on-CPU time: on a busy host the functions' wall times carry every rank's wait
    for a CPU and hide it."""
    host = context.host
    if host is None or host.on_cpu_steps is None:
        return {}
    found = {}
    for i in range(len(context.features.ranks)):
        against = PeerCpu.of(host, i, context.reference_peers(i), context.material_ms(i))
        work = cpu_work_excess(against)
        if work is not None:
            found[i] = work
    return found


def _group_median(
    values: NDArray[np.float64], groups: PeerGroups, reference: NDArray[np.bool_]
) -> NDArray[np.float64]:
    """(R,) each rank's group median of `values` over the reference ranks."""
    out = np.full(len(values), np.nan)
    for group in range(len(groups.names)):
        members = groups.members(group)
        pool = members[reference[members]] if reference[members].any() else members
        out[members] = np.nanmedian(values[pool]) if len(pool) else np.nan
    return out


def suspect_worker(suspect: Suspect) -> SlowWorker | None:
    """The suspect's record: the functions and categories that stand out from its peers', else
    (a suspect by its on-CPU time alone) those whose time grew most."""
    worker = _outlying_worker(suspect.context, suspect.position)
    if worker is None and suspect.work is not None:
        worker = _computing_worker(suspect.context, suspect.position, suspect.work)
    return worker


def _outlying_worker(context: PeerContext, i: int) -> SlowWorker | None:
    features, dev = context.features, context.dev
    nw = features.non_wait_index
    outlying_categories = np.flatnonzero(dev.outlying[i] & context.categories)
    outlying_functions = np.flatnonzero(dev.outlying[i] & context.functions)
    if dev.outlying[i, nw]:
        k = nw
        excess = float(dev.excess_ms[i, nw])
        steps_outlying, steps = int(dev.steps_outlying[i, nw]), int(dev.steps_valid[i, nw])
    else:
        # The non-wait total did not pass on its own (part of it was a one-off spike, or the
        # peers' totals are noisy on a busy host): count the outlying work, function by
        # function or category by category, whichever says more.
        excess = max(
            float(np.maximum(dev.excess_ms[i, outlying_categories], 0).sum()),
            float(np.maximum(dev.excess_ms[i, outlying_functions], 0).sum()),
        )
        best = outlying_categories if len(outlying_categories) else outlying_functions
        if not len(best):
            return None  # a suspect by its on-CPU time alone (_computing_worker)
        k = int(best[np.argmax(dev.excess_ms[i, best])])
        steps_outlying, steps = int(dev.steps_outlying[i, k]), int(dev.steps_valid[i, k])
    if excess <= 0:
        return None
    fn_order = outlying_functions[np.argsort(-dev.excess_ms[i, outlying_functions])]
    contributors = [contributor(features, dev, i, int(k)) for k in fn_order[:TOP_CONTRIBUTORS]]
    step = float(features.mean_step_ms[i])
    shown = np.flatnonzero(context.categories & (dev.excess_ms[i] >= 0.01 * step))
    shown = shown[np.argsort(-dev.excess_ms[i, shown])]
    category_rows = [contributor(features, dev, i, int(k)) for k in shown]
    if not contributors:
        contributors = [c for c in category_rows if c.outlying][:TOP_CONTRIBUTORS]
    if not contributors and dev.outlying[i, nw]:
        # The total is outlying, spread over functions none of which is alone: the categories
        # holding the excess are its contributors.
        contributors = [c for c in category_rows if c.excess_ms > 0][:TOP_CONTRIBUTORS]
    if not contributors:
        return None
    root_k = (
        int(outlying_categories[np.argmax(dev.excess_ms[i, outlying_categories])])
        if len(outlying_categories)
        else None
    )
    root = finding_category(
        features.categories[root_k] if root_k is not None else contributors[0].category
    )
    basis = "category of the largest contributor to the excess; no hardware samples say otherwise"
    if is_idle(root):
        root = "python"
        basis = (
            f"{UNATTRIBUTED} on this rank (no profiled op ran); Python code between ops is the "
            "usual cause — capture with Python stacks to name the function"
        )
    return SlowWorker(
        **context.rank_times(i),
        step_ms=step,
        excess_ms=excess,
        excess_basis="total" if k == nw else "outlying",
        steps_outlying=steps_outlying,
        steps=steps,
        contributors=contributors,
        categories=category_rows,
        root_category=root,
        root_basis=basis,
        intermittent=bool(dev.intermittent is not None and dev.intermittent[i, k]),
    )


def _computing_worker(context: PeerContext, i: int, work: CpuWork) -> SlowWorker | None:
    """A rank found by its extra on-CPU time alone: no function passed the peer comparison, so
    its contributors are the functions and categories whose time grew most."""
    features, dev = context.features, context.dev
    grew = np.flatnonzero(context.functions & (dev.excess_ms[i] > 0))
    grew = grew[np.argsort(-dev.excess_ms[i, grew])]
    grew_categories = np.flatnonzero(context.categories & (dev.excess_ms[i] > 0))
    grew_categories = grew_categories[np.argsort(-dev.excess_ms[i, grew_categories])]
    contributors = [contributor(features, dev, i, int(k)) for k in grew[:TOP_CONTRIBUTORS]]
    category_rows = [contributor(features, dev, i, int(k)) for k in grew_categories]
    if not contributors:
        contributors = category_rows[:TOP_CONTRIBUTORS]
    if not contributors:
        return None
    root = finding_category(
        features.categories[int(grew_categories[0])]
        if len(grew_categories)
        else contributors[0].category
    )
    if is_idle(root):
        root = "python"
    return SlowWorker(
        **context.rank_times(i),
        step_ms=float(features.mean_step_ms[i]),
        excess_ms=work.excess_ms,
        excess_basis="cpu",
        steps_outlying=work.steps_shown,
        steps=work.steps,
        contributors=contributors,
        categories=category_rows,
        root_category=root,
        root_basis=(
            f"its training thread computed {work.on_cpu_ms:.1f} ms/step against its peers' "
            f"{work.peers_on_cpu_ms:.1f} (on-CPU, step by step); category of the largest growth"
        ),
        intermittent=work.steps_shown < context.thresholds.min_persistence * work.steps,
    )
