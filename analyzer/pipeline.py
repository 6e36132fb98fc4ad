"""The analysis end to end: load → compare → fuse → verdict.json + report.html."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace

import numpy as np
import pyarrow as pa

from perfdiag.analyzer.compare.collectives import analyze_collectives
from perfdiag.analyzer.compare.features import Features, StepTimes, build_features
from perfdiag.analyzer.compare.outliers import Deviations, compare_peers
from perfdiag.analyzer.compare.peers import PeerGroups, RoleAssigner, by_collectives
from perfdiag.analyzer.errors import NoCaptureError
from perfdiag.analyzer.findings.collective_findings import (
    annotate_slow_workers,
    slow_link_findings,
    without_explained_waiting,
)
from perfdiag.analyzer.findings.fusion import Fusion, fuse
from perfdiag.analyzer.findings.imbalance import imbalance_findings
from perfdiag.analyzer.findings.kernel_speed import (
    kernel_speed_anomalies,
    kernel_speed_findings,
)
from perfdiag.analyzer.findings.nodes import slow_node_findings
from perfdiag.analyzer.findings.reported import (
    communication_findings,
    hang_findings,
    hardware_findings,
    kernels_of_gpu_culprits,
    range_findings,
    slow_worker_findings,
)
from perfdiag.analyzer.findings.rules import check_expected_ranges
from perfdiag.analyzer.findings.slow_worker import SlowWorker
from perfdiag.analyzer.findings.throttle import HardwareReader, with_throttle_reasons
from perfdiag.analyzer.load.capture import Capture, Notes
from perfdiag.analyzer.load.capture_folder import load_capture
from perfdiag.analyzer.load.workers import account_workers
from perfdiag.analyzer.report.analysis import Analysis
from perfdiag.analyzer.report.html import render_report
from perfdiag.analyzer.report.timeline import build_timeline
from perfdiag.analyzer.report.verdict import verdict_of
from perfdiag.analyzer.signals.contention import CpuWait, cpu_wait, without_chance_cpu_anomalies
from perfdiag.analyzer.signals.cpu_cause import RankCpu, host_note, rank_cpu
from perfdiag.analyzer.signals.hardware import (
    ResourceAnomaly,
    resource_anomalies,
    without_shared_host_resources,
)
from perfdiag.analyzer.signals.host_usage import cpu_wait_matrix
from perfdiag.analyzer.signals.user_frame import (
    EventsReader,
    excess_frames,
    is_user_frame,
    user_frame,
)
from perfdiag.api.breakdown import Breakdown
from perfdiag.api.schema import WorkerMeta
from perfdiag.api.thresholds import Thresholds
from perfdiag.api.verdict import Verdict
from perfdiag.storage import Storage, StorageError, StorageNotFound, layout, open_storage

Progress = Callable[[str], None]

KIND_ORDER = {
    "hang": 0,
    "slow_node": 1,
    "slow_worker": 1,
    "hardware": 2,
    "function_anomaly": 3,
    "imbalance": 4,
    "expected_range": 5,
}
FEATURE_FLOOR_SHARE = 0.5
"""Functions are kept dense when their β reaches this share of the materiality threshold."""


def analyze_capture(
    capture: Capture,
    thresholds: Thresholds | None = None,
    expected_ranks: list[int] | None = None,
    *,
    roles: RoleAssigner | None = None,
    progress: Progress | None = None,
    read_hardware: HardwareReader | None = None,
    read_events: EventsReader | None = None,
    notes: Notes | None = None,
) -> Analysis:
    """Compare the workers of `capture` and build the verdict. `read_hardware` gives a rank's
    hardware.parquet, for the throttle reasons of the GPUs a finding blames; `notes`: where the
    readers say what they could not read (default: new notes of the capture)."""
    say = progress or (lambda _msg: None)
    notes = Notes.of(capture) if notes is None else notes
    limits = thresholds or Thresholds()
    steps = StepTimes.from_metas(capture.metas)
    features = build_features(
        capture.summary,
        steps,
        min_beta=FEATURE_FLOOR_SHARE * limits.min_excess_fraction,
        cpu_wait=cpu_wait_matrix(capture.metas, steps.ranks, steps.durations_ms.shape[1]),
    )
    # Default roles: process-group communication when the capture has collective calls.
    groups = (roles or by_collectives(capture.collectives))(features, limits.role_split_jaccard)
    say(f"comparing {len(features.ranks)} workers ({len(groups.names)} peer group(s))")
    host = rank_cpu(capture.metas, features)
    cpu = cpu_wait(capture.summary, features)
    anomalies, chance = without_chance_cpu_anomalies(
        resource_anomalies(capture.summary, features, groups, limits),
        cpu,
        features,
        groups,
        host.host_load if host is not None else None,
    )
    notes.add(*chance)
    if anomalies:  # each rank's host, for the few captures with a resource anomaly
        hosts = dict(zip(capture.metas.ranks.tolist(), capture.metas.hosts(), strict=True))
        anomalies, shared = without_shared_host_resources(anomalies, hosts)
        notes.add(*shared)
    speed = kernel_speed_anomalies(capture.summary, features, groups, limits)
    deviations, fusion = _culprits(
        capture.summary, features, groups, limits, anomalies + speed, cpu, host
    )
    notes.add(*(c.describe() for c in fusion.contended), *fusion.contended_notes)
    if read_events is not None:
        fusion = _name_user_frames(fusion, features, groups, capture.metas, read_events, notes)
    host_condition = host_note(host) if host is not None else None
    if host_condition is not None:
        notes.add_first(host_condition)
    collectives = analyze_collectives(capture.collectives, features, groups, limits)
    has_gpu = capture.metas.any_gpu()
    violations = check_expected_ranges(
        capture.summary, features, groups, fusion, limits, has_gpu=has_gpu
    )
    median_step = float(steps.median_ms.mean()) if len(steps.ranks) else None
    account = account_workers(capture, expected_ranks, limits, median_step)
    notes.add(*account.notes)

    candidates = [
        *slow_worker_findings(
            fusion,
            features,
            groups,
            limits,
            kernels_of_gpu_culprits(fusion, features, groups, capture.summary),
        ),
        *without_explained_waiting(communication_findings(fusion), collectives, features),
        *hardware_findings(anomalies, features, fusion),
        *kernel_speed_findings(speed, features, fusion),
        *slow_link_findings(collectives, features),
        *imbalance_findings(capture.metas, features, groups, fusion),
    ]
    candidates = slow_node_findings(candidates, capture.metas)
    reported = hang_findings(account)
    reported += [r for r in candidates if r.finding.severity >= limits.report_severity]
    below = [r for r in candidates if r.finding.severity < limits.report_severity]
    reported = annotate_slow_workers(reported, collectives, features)
    reported = with_throttle_reasons(reported, read_hardware)
    # Ties: the fused slow_worker before the function_anomaly it contains.
    reported.sort(key=lambda r: (-r.finding.severity, KIND_ORDER[r.finding.kind]))
    # Whole-job efficiency against expected ranges: advice, never a culprit (docs/design.md §4).
    observations = range_findings(violations)
    return Analysis(
        capture=capture,
        thresholds=limits,
        account=account,
        steps=steps,
        features=features,
        groups=groups,
        deviations=deviations,
        anomalies=anomalies,
        fusion=fusion,
        violations=violations,
        reported=reported,
        observations=observations,
        below_threshold=below,
        has_gpu=has_gpu,
        notes=notes,
        host_note=host_condition,
        collectives=collectives,
    )


MAX_CULPRIT_ROUNDS = 4
USER_FRAME_CATEGORIES = frozenset({"python", "dataloader", "gc", "cpu_op"})
LIBRARY_PREFIX = "torch/"


def _name_user_frames(
    fusion: Fusion,
    features: Features,
    groups: PeerGroups,
    metas: Mapping[int, WorkerMeta],
    read_events: EventsReader,
    notes: Notes,
) -> Fusion:
    """The fusion with the user's frame behind each culprit's excess (analyzer/signals/
    user_frame.py): the frame whose inclusive time exceeds a typical peer's by most of the
    excess, else, for a Python contributor that is not the user's code, the frame inside or
    around it."""
    named = {w.position for w in fusion.slow}
    return replace(
        fusion,
        slow=[
            _with_user_frame(worker, features, groups, metas, read_events, named, notes)
            for worker in fusion.slow
        ],
    )


def _with_user_frame(
    worker: SlowWorker,
    features: Features,
    groups: PeerGroups,
    metas: Mapping[int, WorkerMeta],
    read_events: EventsReader,
    named: set[int],
    notes: Notes,
) -> SlowWorker:
    top = worker.top
    if top is None or top.category not in USER_FRAME_CATEGORIES | {"host"}:
        return worker
    events = read_events(worker.rank)
    if events is None:
        return worker
    nw = features.non_wait_index
    peers = [int(p) for p in groups.members(worker.group).tolist() if p not in named]
    found: str | None = None
    callers: tuple[str, ...] = ()
    try:
        if peers:
            # A typical peer: the median one by time outside communication.
            peer = peers[int(np.argsort(features.ms[peers, nw])[len(peers) // 2])]
            peer_rank = int(features.ranks[peer])
            peer_events = read_events(peer_rank)
            if peer_events is not None:
                # Frames hold wall time: held against the rank's extra own time in wall
                # time too (its excess may count extra computation at a busy host's toll).
                own = worker.own_excess_ms
                path = excess_frames(
                    events,
                    metas[worker.rank].window.steps,
                    peer_events,
                    metas[peer_rank].window.steps,
                    min(worker.excess_ms, own) if own > 0 else worker.excess_ms,
                    worker.step_ms,
                )
                if path:
                    found, callers = path[-1], path[:-1]
        if (
            found is None
            and top.function is not None
            and top.category in ("python", "dataloader", "gc")
            and not is_user_frame(top.function)
        ):
            enclosing = top.category == "python" and not top.function.startswith(LIBRARY_PREFIX)
            found = user_frame(events, top.function, enclosing=enclosing)
    except (pa.ArrowException, KeyError, ValueError) as exc:
        notes.add(f"rank {worker.rank}: the user's frame was not found ({exc})")
    return replace(worker, user_function=found, user_callers=callers)


def _culprits(
    summary: pa.Table,
    features: Features,
    groups: PeerGroups,
    limits: Thresholds,
    anomalies: list[ResourceAnomaly],
    cpu: CpuWait | None,
    host: RankCpu | None,
) -> tuple[Deviations, Fusion]:
    """Compare and fuse until no new culprit appears: the ranks named in one round are no
    reference for the others in the next (several culprits, graded stragglers)."""
    excluded = np.zeros(len(features.ranks), dtype=bool)
    deviations = compare_peers(summary, features, groups, limits)
    fusion = fuse(features, deviations, groups, limits, anomalies, cpu, host)
    for _ in range(MAX_CULPRIT_ROUNDS):
        named = excluded.copy()
        named[[w.position for w in fusion.slow]] = True
        if (named == excluded).all():
            break
        excluded = named
        again = compare_peers(summary, features, groups, limits, excluded)
        refused = fuse(features, again, groups, limits, anomalies, cpu, host, excluded)
        if not {w.position for w in fusion.slow} <= {w.position for w in refused.slow}:
            break  # a culprit would be lost: keep the round that named it
        deviations, fusion = again, refused
    return deviations, fusion


def run_analysis(
    source: str | Storage,
    out: Storage | None = None,
    *,
    progress: Progress | None = None,
    thresholds: Thresholds | None = None,
    expected_ranks: list[int] | None = None,
    jobs: int = 1,
) -> Verdict:
    say = progress or (lambda _msg: None)
    storage = source if isinstance(source, Storage) else open_storage(source)
    root = storage.local_path(layout.PLAN)
    if root is not None and not root.parent.is_dir():
        raise NoCaptureError(f"no capture in {storage.uri}: the folder does not exist")
    capture = load_capture(storage, say, jobs)
    notes = Notes.of(capture)
    target = out or storage
    seconds: dict[str, float] = {}  # writing time of each file, for the progress line
    try:
        started = time.monotonic()
        analysis = analyze_capture(
            capture,
            thresholds,
            expected_ranks,
            progress=say,
            read_hardware=_hardware_reader(storage, capture, notes),
            read_events=_events_reader(storage, capture, notes),
            notes=notes,
        )
        say(f"compared {len(capture.metas)} workers in {time.monotonic() - started:.1f} s")
        # The timeline first: the raw events it reads may add input notes to the verdict.
        _timed(
            seconds,
            layout.TIMELINE,
            lambda: target.put_bytes(layout.TIMELINE, build_timeline(analysis, storage)),
        )
    finally:
        capture.close()  # the timeline was the last to read its temporary files
    verdict = verdict_of(analysis)
    _timed(
        seconds,
        layout.REPORT,
        lambda: target.put_text(layout.REPORT, render_report(analysis, verdict)),
    )
    if capture.breakdown:
        breakdown = Breakdown(ranks={str(r): b for r, b in sorted(capture.breakdown.items())})
        target.put_text(layout.BREAKDOWN, breakdown.to_json())
    # verdict.json last: its presence tells readers the analysis is complete.
    _timed(seconds, layout.VERDICT, lambda: target.put_text(layout.VERDICT, verdict.to_json()))
    say(
        f"wrote in {sum(seconds.values()):.1f} s: "
        + ", ".join(f"{name} {taken:.1f} s" for name, taken in seconds.items())
    )
    say(_wrote_line(target, breakdown=bool(capture.breakdown)))
    return verdict


def _timed(seconds: dict[str, float], name: str, write: Callable[[], None]) -> None:
    started = time.monotonic()
    write()
    seconds[name] = time.monotonic() - started


def _wrote_line(target: Storage, *, breakdown: bool) -> str:
    """Every file of the output a user opens, the run's native log among them when it is there."""
    files = [
        layout.VERDICT,
        layout.REPORT,
        f"{layout.TIMELINE} (open it in ui.perfetto.dev)",
        *([layout.BREAKDOWN] if breakdown else []),
    ]
    native_log = target.local_path(layout.NATIVE_LOG)
    if native_log is not None and native_log.is_file():
        files.append(f"{layout.NATIVE_LOG} (the profiler's own log lines)")
    return f"wrote {', '.join(files[:-1])} and {files[-1]} in {target.uri}"


def _hardware_reader(storage: Storage, capture: Capture, notes: Notes) -> HardwareReader:
    def read(rank: int) -> pa.Table | None:
        key = capture.hardware_key(rank)
        if key is None:
            return None
        try:
            return _read_parquet(storage, key)
        except (StorageError, pa.ArrowException) as exc:
            # Throttle reasons only add to a finding: say why they are absent, go on.
            notes.add(f"rank {rank}: {key} not read ({exc})")
            return None

    return read


def _events_reader(storage: Storage, capture: Capture, notes: Notes) -> EventsReader | None:
    if capture.kind != "capture":
        return None

    def read(rank: int) -> pa.Table | None:
        key = layout.worker_key(rank, layout.EVENTS)
        if not capture.may_have_events(rank):
            return None  # raw events not kept: the contributor's own name stands
        try:
            return _read_parquet(storage, key)
        except StorageNotFound:
            return None  # raw events not kept: the contributor's own name stands
        except (StorageError, pa.ArrowException, OSError) as exc:
            notes.add_input(f"ignored {storage.uri_of(key)}: {exc}")
            return None

    return read


def _read_parquet(storage: Storage, key: str) -> pa.Table:
    # Imported here: the analysis of a folder of Kineto traces never loads pyarrow.parquet.
    from perfdiag.engine.parquet_io import table_from_bytes

    return table_from_bytes(storage.get_bytes(key))
