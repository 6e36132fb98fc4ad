"""The agent: turns the hook's spool into a worker's files in storage (docs/design.md §1, §3).

`process_window` handles one rank's completed window: events.parquet (raw events, when kept),
summary.parquet (the behavior pattern), stacks.json (when the hook dumped stacks) and, last,
status.json. `run_agent` is the sidecar loop around it: it follows every rank of a spool,
uploads status heartbeats, processes each completed window once, and outlives storage outages.

The sidecar records each upload in a folder of its own under the spool (`<spool>/agent/`,
collector/hook/spool.py) and then removes the uploaded files from the spool, so the spool holds
only what is not uploaded yet, whatever the number of diagnoses. It never writes into the hook's
folders: the training often runs as another user (root) than the agent (10001).

A sidecar writes the files of plan P under `<storage>/<P>/` (one diagnosis = one prefix); the
local runner calls `process_window` with the diagnosis' own storage. On Kubernetes it also
follows its pod's plan in storage (collector/pod_plan.py) and mirrors it into the spool, where
the hooks read it without waiting for the kubelet's refresh of the downward-API file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfdiag.api.worker import BlockedIn, WorkerPhase, WorkerStatus
from perfdiag.collector.hook import spool
from perfdiag.collector.hook.plan import PlanError, parse_plan, plan_json
from perfdiag.collector.pod_plan import PodPlanFollower, remove_mirror
from perfdiag.storage import Storage, StorageError, layout, open_storage
from perfdiag.storage.retry import RetryPolicy

# The modules that load pyarrow and numpy (collector.hardware and window_reader, engine,
# api.schema and taxonomy) are imported in the functions that sample or process a window: a
# sidecar waiting for a plan, most of its life, then holds 30 MiB instead of 90.
if TYPE_CHECKING:
    from perfdiag.collector.hardware import HardwareSampler, Series

log = logging.getLogger("perfdiag.agent")

WINDOW_MARGIN_NS = 200_000_000  # hardware samples kept around a window's steps
KEPT_RECORDS = 32
"""Upload records kept per rank and kind (window, stack dump): the newest ones, and any whose
files are still in the spool. An older one would only matter to a plan sent again after 32
newer ones (the operator sends one plan at a time and never an old one again)."""

# Hook heartbeat phase → worker status phase.
_PHASES: dict[str, WorkerPhase] = {
    "dormant": "dormant",
    "armed": "armed",
    "capturing": "capturing",
    "writing": "processing",
    "failed": "failed",
}


def window_complete(spool_dir: Path, rank: int, plan_id: str) -> bool:
    """True once the hook has finished the window (hook.json is written last, also on error)."""
    return isinstance(
        spool.read_json(spool.window_dir(spool_dir, rank, plan_id) / spool.HOOK_META), dict
    )


def process_window(
    spool_dir: Path,
    rank: int,
    plan_id: str,
    storage: Storage,
    *,
    keep_raw: bool = True,
    pod: str | None = None,
    hardware: Sequence[Series] | None = None,
) -> WorkerStatus:
    """Write the worker files of one completed window and return its status (phase "done", or
    "failed" with the reason when the window is unusable). Storage errors propagate (the caller
    retries); a malformed window does not raise.

    `hardware`: this worker's samples (collector/hardware.py `worker_series`) taken during the
    window: written as hardware.parquet, and the summary gets each function's governing
    resource μ/σ from them."""
    # pyarrow and numpy: see the note at the top.
    from perfdiag.api.schema import SUMMARY_SCHEMA_ID, with_meta
    from perfdiag.api.taxonomy import same_columns
    from perfdiag.collector.hardware import hardware_table, within
    from perfdiag.collector.window_reader import read_hook_window, step_counters_ms
    from perfdiag.engine.hardware_samples import with_resources
    from perfdiag.engine.host_usage import host_usage
    from perfdiag.engine.kineto import TraceError
    from perfdiag.engine.parquet_io import table_to_bytes
    from perfdiag.engine.summary import summarize

    folder = spool.window_dir(spool_dir, rank, plan_id)
    hook = spool.read_json(folder / spool.HOOK_META)
    beat = _heartbeat(spool_dir, rank)
    files: list[str] = []
    files += upload_stacks(spool_dir, rank, plan_id, storage)
    error: str | None = None
    if not isinstance(hook, dict):
        error = f"{folder / spool.HOOK_META} is missing or not a JSON object"
    elif hook.get("error"):
        error = f"the hook could not capture the window: {hook['error']}"
    else:
        try:
            with same_columns():  # the read and the summary ask about the same columns
                events, meta = read_hook_window(folder, hook, rank=rank, plan_id=plan_id, pod=pod)
                summary = summarize(events, meta)
        except TraceError as exc:
            error = str(exc)
        else:
            if hardware:
                # The window's steps, and a margin for counters' rates at its edges.
                start, end = meta.window.span_ns
                kept = within(hardware, start - WINDOW_MARGIN_NS, end + WINDOW_MARGIN_NS)
                samples = hardware_table(kept, meta)
                if samples.num_rows:  # none when sampling began after the window (a restart)
                    summary = with_resources(summary, events, samples)
                    usage = host_usage(samples, meta, events, step_counters_ms(hook, meta.window))
                    if usage is not None:
                        meta = meta.model_copy(update={"host_usage": usage})
                        summary = summary.replace_schema_metadata(
                            with_meta(summary.schema, SUMMARY_SCHEMA_ID, meta).metadata
                        )
                    key = layout.worker_key(rank, layout.HARDWARE)
                    storage.put_bytes(key, table_to_bytes(samples))
                    files.append(key)
            if keep_raw:
                key = layout.worker_key(rank, layout.EVENTS)
                storage.put_bytes(key, table_to_bytes(events))
                files.append(key)
            key = layout.worker_key(rank, layout.SUMMARY)
            storage.put_bytes(key, table_to_bytes(summary))
            files.append(key)
    hook_info = hook if isinstance(hook, dict) else {}
    status = WorkerStatus(
        rank=rank,
        host=_text(hook_info.get("host")) or _text(beat.get("host")),
        pod=pod,
        plan_id=plan_id,
        phase="failed" if error else "done",
        step=_step(beat, hook_info),
        last_step_unix=_number(beat.get("last_step_unix")),
        updated_unix=time.time(),
        files=files,
        error=error,
    )
    storage.put_text(layout.worker_key(rank, layout.STATUS), status.model_dump_json())
    return status


def upload_stacks(spool_dir: Path, rank: int, plan_id: str, storage: Storage) -> list[str]:
    """stacks.json (and the Flight Recorder dump written with it) of one stacks plan; the keys
    written (none when the rank has not dumped its stacks for that plan)."""
    path = spool.stacks_file(spool_dir, rank, plan_id)
    if not path.is_file():
        return []
    keys = []
    recorder = spool.flight_recorder_file(spool_dir, rank, plan_id)
    if recorder.is_file():
        keys.append(layout.worker_key(rank, layout.FLIGHT_RECORDER))
        storage.put_file(keys[-1], recorder)
    key = layout.worker_key(rank, layout.STACKS)
    storage.put_file(key, path)
    return [key, *keys]


def _heartbeat(spool_dir: Path, rank: int) -> dict[str, Any]:
    beat = spool.read_json(spool.rank_dir(spool_dir, rank) / spool.HEARTBEAT)
    return beat if isinstance(beat, dict) else {}


def _step(beat: dict[str, Any], hook: dict[str, Any]) -> int:
    step = beat.get("step")
    if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
        return step
    first, steps = hook.get("first_step"), hook.get("steps")
    if isinstance(first, int) and isinstance(steps, int):
        return max(first + steps, 0)
    return 0


def blocked_in(beat: dict[str, Any]) -> BlockedIn | None:
    """The heartbeat's `blocked_in` (hook: set while the step is late), when well-formed."""
    value = beat.get("blocked_in")
    if not isinstance(value, dict):
        return None
    try:
        return BlockedIn.model_validate(value)
    except ValueError:
        return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


# ---------------------------------------------------------------------------------------------
# The sidecar loop


@dataclass
class _Retry:
    """Backoff of one piece of work after storage errors in a row."""

    failures: int = 0
    next_s: float = 0.0


@dataclass
class AgentState:
    """What the loop remembers between polls (exposed for tests and the CLI's summary)."""

    processed: set[tuple[int, str]] = field(default_factory=set)  # (rank, plan id)
    stacks: set[tuple[int, str]] = field(default_factory=set)
    kept: set[tuple[str, int, str]] = field(default_factory=set)
    """Uploaded files that could not be removed from the spool (not tried again)."""
    final: dict[tuple[int, str], WorkerStatus] = field(default_factory=dict)
    last_status: dict[int, tuple[str, float]] = field(default_factory=dict)  # json, when sent
    retries: dict[tuple[str, int, str], _Retry] = field(default_factory=dict)
    sampler: HardwareSampler | None = None
    """Hardware sampling while some rank has a window armed, open or being written."""


def run_agent(
    spool_dir: Path,
    storage: Storage,
    *,
    stop: threading.Event,
    poll_s: float = 1.0,
    heartbeat_s: float = 5.0,
    ranks: Sequence[int] | None = None,
    plan_file: Path | None = None,
    keep_raw: bool = True,
    pod: str | None = None,
    storage_for: Callable[[str], Storage] | None = None,
    max_backoff_s: float = 30.0,
    once: bool = False,
    state: AgentState | None = None,
    sample_hardware: bool = True,
    pod_plan: PodPlanFollower | None = None,
) -> AgentState:
    """Follow the spool until `stop` is set (or one pass when `once`).

    Each poll: upload the status of every rank with a known plan (the plan file's, else the
    one the hook reports) when it changed, at most every `heartbeat_s` unless its phase
    changed; upload stack dumps; process every completed window once (remembered in memory
    and by a record in the spool's agent folder, after which the window's or the dump's files
    are removed from the spool). A storage error postpones that piece of work
    with the storage retry policy's backoff (perfdiag.storage.retry: from 1 s, doubling, with
    jitter, up to `max_backoff_s`); nothing stops the loop but `stop`.
    With `sample_hardware` (and not `once`), the hardware sampler runs from the moment a rank
    arms a window until every such window is processed; each worker's samples go into its
    hardware.parquet and its summary's resource μ/σ.
    `pod_plan`: follow the pod's plan in storage on a thread of its own (one read when `once`),
    mirrored into the spool for the hooks; its mirror is removed when the loop stops, so that
    the hooks read the kubelet's file at once.
    """
    state = state or AgentState()
    if pod_plan is not None:
        if once:
            pod_plan.poll_once()
        else:
            pod_plan.start(stop)
    backoff = RetryPolicy(initial_delay_s=1.0, max_delay_s=max_backoff_s)
    destinations: dict[str, Storage] = {}

    def destination(plan_id: str) -> Storage:
        if plan_id not in destinations:
            destinations[plan_id] = (
                storage_for(plan_id) if storage_for else open_storage(storage.uri_of(plan_id))
            )
        return destinations[plan_id]

    while True:
        if sample_hardware and not once:
            _follow_windows(spool_dir, _ranks(spool_dir, ranks), state)
        for rank in _ranks(spool_dir, ranks):
            _poll_rank(
                spool_dir,
                rank,
                plan_file,
                destination,
                state,
                heartbeat_s,
                backoff,
                keep_raw,
                pod,
            )
        if once or stop.wait(poll_s):
            if state.sampler is not None:
                state.sampler.stop()
                state.sampler = None
            if pod_plan is not None and not once:
                remove_mirror(spool_dir)
            return state


_WINDOW_PHASES = ("armed", "capturing", "writing")


def _follow_windows(spool_dir: Path, ranks: Sequence[int], state: AgentState) -> None:
    """Start the sampler when a rank arms a window; stop it when no window is open and every
    completed window has been processed."""
    beats = {rank: _heartbeat(spool_dir, rank) for rank in ranks}
    open_window = any(beat.get("phase") in _WINDOW_PHASES for beat in beats.values())
    if open_window and state.sampler is None:
        from perfdiag.collector.hardware import HardwareSampler  # numpy: see the note at the top

        pids = {r: b["pid"] for r, b in beats.items() if isinstance(b.get("pid"), int)}
        state.sampler = HardwareSampler(pids=pids)
        for note in state.sampler.notes:
            log.info("hardware sampler: %s", note)
        state.sampler.start()
    elif not open_window and state.sampler is not None:
        pending = any(
            (rank, plan_id) not in state.processed
            for rank in ranks
            for plan_id in _completed_windows(spool_dir, rank)
        )
        if not pending:
            state.sampler.stop()
            state.sampler = None


def _hardware_for(spool_dir: Path, rank: int, state: AgentState) -> list[Series] | None:
    if state.sampler is None:
        return None
    from perfdiag.collector.hardware import gpu_index, worker_series  # numpy: the note at the top

    local_rank = _heartbeat(spool_dir, rank).get("local_rank")
    gpu = gpu_index(local_rank if isinstance(local_rank, int) else None)
    return worker_series(state.sampler.samples(), rank, gpu)


def _ranks(spool_dir: Path, ranks: Sequence[int] | None) -> list[int]:
    present = spool.ranks_in(spool_dir)
    return [r for r in present if r in ranks] if ranks is not None else present


def _poll_rank(
    spool_dir: Path,
    rank: int,
    plan_file: Path | None,
    destination: Callable[[str], Storage],
    state: AgentState,
    heartbeat_s: float,
    backoff: RetryPolicy,
    keep_raw: bool,
    pod: str | None,
) -> None:
    for plan_id in _completed_windows(spool_dir, rank):
        if (rank, plan_id) in state.processed:
            continue
        _attempt(
            state,
            ("window", rank, plan_id),
            backoff,
            partial(_process, spool_dir, rank, plan_id, destination, state, keep_raw, pod),
        )
    _remove_uploaded(spool_dir, rank, state)
    for plan_id in _stack_dumps(spool_dir, rank):
        if (rank, plan_id) in state.stacks:
            continue
        _attempt(
            state,
            ("stacks", rank, plan_id),
            backoff,
            partial(_stacks, spool_dir, rank, plan_id, destination, state),
        )
    current = _current_plan(spool_dir, rank, plan_file)
    if current is not None:
        _attempt(
            state,
            ("status", rank, current),
            backoff,
            partial(
                _heartbeat_status, spool_dir, rank, current, destination, state, heartbeat_s, pod
            ),
        )


def _attempt(
    state: AgentState, key: tuple[str, int, str], backoff: RetryPolicy, work: Callable[[], None]
) -> None:
    retry = state.retries.get(key)
    now = time.monotonic()
    if retry is not None and now < retry.next_s:
        return
    try:
        work()
    except StorageError as exc:
        retry = retry or _Retry()
        retry.failures += 1
        delay = backoff.delay(retry.failures)
        log.warning(
            "rank %d: %s for plan %s failed (%s); retrying in %.0f s",
            key[1],
            key[0],
            key[2],
            exc,
            delay,
        )
        retry.next_s = now + delay
        state.retries[key] = retry
    else:
        state.retries.pop(key, None)


def _window_ids(spool_dir: Path, rank: int) -> Iterator[str]:
    folder = spool.rank_dir(spool_dir, rank) / "windows"
    with contextlib.suppress(FileNotFoundError):
        for entry in folder.iterdir():
            yield entry.name


def _stack_ids(spool_dir: Path, rank: int) -> Iterator[str]:
    for entry in (spool.rank_dir(spool_dir, rank) / "stacks").glob("*.json"):
        yield entry.stem


def _completed_windows(spool_dir: Path, rank: int) -> list[str]:
    """Windows the hook has finished and the agent has not uploaded."""
    return sorted(
        plan_id
        for plan_id in _window_ids(spool_dir, rank)
        if (spool.window_dir(spool_dir, rank, plan_id) / spool.HOOK_META).is_file()
        and not spool.uploaded_window_mark(spool_dir, rank, plan_id).exists()
    )


def _stack_dumps(spool_dir: Path, rank: int) -> list[str]:
    return sorted(
        plan_id
        for plan_id in _stack_ids(spool_dir, rank)
        if not spool.uploaded_stacks_mark(spool_dir, rank, plan_id).exists()
    )


def _remove_uploaded(spool_dir: Path, rank: int, state: AgentState) -> None:
    """Remove what was uploaded and recorded but is still in the spool (an agent stopped
    between its record and the removal)."""
    for plan_id in list(_window_ids(spool_dir, rank)):
        if ("window", rank, plan_id) not in state.kept and (
            spool.uploaded_window_mark(spool_dir, rank, plan_id).exists()
        ):
            _remove_window(spool_dir, rank, plan_id, state)
    for plan_id in list(_stack_ids(spool_dir, rank)):
        if ("stacks", rank, plan_id) not in state.kept and (
            spool.uploaded_stacks_mark(spool_dir, rank, plan_id).exists()
        ):
            _remove_stacks(spool_dir, rank, plan_id, state)


def _remove_window(spool_dir: Path, rank: int, plan_id: str, state: AgentState) -> None:
    """Remove an uploaded window from the spool (its trace is MBs): possible whatever user
    wrote it, as the hook makes its folders writable by all."""
    folder = spool.window_dir(spool_dir, rank, plan_id)
    try:
        for entry in folder.iterdir():
            entry.unlink()
        folder.rmdir()
    except FileNotFoundError:
        return  # gone already
    except OSError as exc:
        _keep(state, ("window", rank, plan_id), folder, exc)


def _remove_stacks(spool_dir: Path, rank: int, plan_id: str, state: AgentState) -> None:
    dump = spool.stacks_file(spool_dir, rank, plan_id)
    try:
        for path in (spool.flight_recorder_file(spool_dir, rank, plan_id), dump):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    except OSError as exc:
        _keep(state, ("stacks", rank, plan_id), dump, exc)


def _keep(state: AgentState, key: tuple[str, int, str], path: Path, exc: OSError) -> None:
    state.kept.add(key)
    log.warning(
        "rank %d: cannot remove %s from the spool after its upload (%s); it stays there",
        key[1],
        path,
        exc,
    )


def _process(
    spool_dir: Path,
    rank: int,
    plan_id: str,
    destination: Callable[[str], Storage],
    state: AgentState,
    keep_raw: bool,
    pod: str | None,
) -> None:
    started = time.monotonic()
    storage = destination(plan_id)
    try:
        status = process_window(
            spool_dir,
            rank,
            plan_id,
            storage,
            keep_raw=keep_raw,
            pod=pod,
            hardware=_hardware_for(spool_dir, rank, state),
        )
    except StorageError:
        raise
    except Exception as exc:  # a bug or an odd window must not stop the other ranks
        log.exception("rank %d: processing window %s failed", rank, plan_id)
        status = WorkerStatus(
            rank=rank,
            pod=pod,
            plan_id=plan_id,
            phase="failed",
            updated_unix=time.time(),
            error=f"processing the window failed: {exc}",
        )
        storage.put_text(layout.worker_key(rank, layout.STATUS), status.model_dump_json())
    log.info(
        "rank %d: window %s %s in %.2f s (%s)",
        rank,
        plan_id,
        status.phase,
        time.monotonic() - started,
        ", ".join(status.files) or status.error,
    )
    state.processed.add((rank, plan_id))
    state.final[(rank, plan_id)] = status
    state.last_status[rank] = (status.model_dump_json(), time.monotonic())
    mark = spool.uploaded_window_mark(spool_dir, rank, plan_id)
    if _mark(mark, storage.uri, status):
        _remove_window(spool_dir, rank, plan_id, state)
        _prune_records(mark.parent, lambda plan: spool.window_dir(spool_dir, rank, plan).exists())


def _stacks(
    spool_dir: Path,
    rank: int,
    plan_id: str,
    destination: Callable[[str], Storage],
    state: AgentState,
) -> None:
    storage = destination(plan_id)
    keys = upload_stacks(spool_dir, rank, plan_id, storage)
    log.info("rank %d: stack dump of plan %s uploaded (%s)", rank, plan_id, ", ".join(keys))
    state.stacks.add((rank, plan_id))
    mark = spool.uploaded_stacks_mark(spool_dir, rank, plan_id)
    if _mark(mark, storage.uri):
        _remove_stacks(spool_dir, rank, plan_id, state)
        _prune_records(mark.parent, lambda plan: spool.stacks_file(spool_dir, rank, plan).exists())


def _mark(path: Path, uri: str, status: WorkerStatus | None = None) -> bool:
    """Remember across agent restarts that this was uploaded, and the outcome; False when the
    record cannot be written (the files then stay in the spool: memory suffices while the
    agent lives, and a restarted agent uploads them again)."""
    record: dict[str, Any] = {"storage": uri, "time_unix": time.time()}
    if status is not None:
        record["status"] = status.model_dump(mode="json")
    try:
        spool.write_json_atomic(path, record, dir_mode=spool.AGENT_DIR_MODE)
    except OSError as exc:
        log.warning("cannot write %s (%s); it will be uploaded again after a restart", path, exc)
        return False
    return True


def _prune_records(folder: Path, files_remain: Callable[[str], bool]) -> None:
    """Keep the KEPT_RECORDS newest upload records of `folder`, and those whose files remain in
    the spool (they keep those files from being uploaded again)."""
    try:
        records = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    except OSError:
        return  # one vanished meanwhile: next time
    for record in records[KEPT_RECORDS:]:
        if not files_remain(record.stem):
            with contextlib.suppress(OSError):
                record.unlink()


def _marked_outcome(spool_dir: Path, rank: int, plan_id: str) -> WorkerStatus | None:
    """The status a previous agent recorded for a processed window."""
    record = spool.read_json(spool.uploaded_window_mark(spool_dir, rank, plan_id))
    if not isinstance(record, dict) or not isinstance(record.get("status"), dict):
        return None
    try:
        return WorkerStatus.model_validate(record["status"])
    except ValueError:
        return None


def _plan_file_id(plan_file: Path) -> str | None:
    """The id of the plan in the plan file (the plan JSON; in a pod, the plan annotation as the
    downward API projects it, or the agent's copy of it, empty when there is none), as the hook
    reads it."""
    try:
        text = plan_json(plan_file.read_bytes())
        plan = parse_plan(text) if text is not None else None
    except (OSError, PlanError):
        return None  # no plan, or one the hook rejects too: no statuses under its id
    if plan is None or plan.action == "stacks":
        return None  # a stacks plan has no statuses of its own: the capture's go on
    return plan.id


def _current_plan(spool_dir: Path, rank: int, plan_file: Path | None) -> str | None:
    """The plan whose status to upload: the one the hooks read (a `watch` plan is only there:
    the hook names the plans it captures for in its heartbeat; the agent's fresh copy of the
    pod's plan, else the plan file: spool.plan_source), else the heartbeat's."""
    source = spool.plan_source(spool_dir, plan_file, time.time())
    if source is not None:
        plan_id = _plan_file_id(source)
        if plan_id is not None:
            return plan_id
    plan_id = _heartbeat(spool_dir, rank).get("plan_id")
    return plan_id if isinstance(plan_id, str) and plan_id else None


def _step_times(beat: dict[str, Any]) -> dict[str, Any]:
    """The heartbeat's mean and longest step over its last `mean_steps` steps (the slowdown
    trigger's input), when it has them."""
    mean, longest, steps = beat.get("mean_step_ms"), beat.get("max_step_ms"), beat.get("mean_steps")
    if not (
        isinstance(mean, (int, float))
        and isinstance(longest, (int, float))
        and isinstance(steps, int)
        and not isinstance(steps, bool)
        and mean >= 0
        and longest >= 0
        and steps >= 1
    ):
        return {}
    return {"mean_step_ms": float(mean), "max_step_ms": float(longest), "mean_steps": steps}


def _heartbeat_status(
    spool_dir: Path,
    rank: int,
    plan_id: str,
    destination: Callable[[str], Storage],
    state: AgentState,
    heartbeat_s: float,
    pod: str | None,
) -> None:
    beat = _heartbeat(spool_dir, rank)
    if not beat:
        return
    final = state.final.get((rank, plan_id)) or _marked_outcome(spool_dir, rank, plan_id)
    phase: WorkerPhase = _PHASES.get(str(beat.get("phase")), "dormant")
    if final is not None:  # the window's outcome stays visible after the hook goes dormant
        phase = final.phase
    elif beat.get("plan_id") != plan_id and phase != "failed":
        phase = "dormant"  # the hook has not taken this plan (yet)
    status = WorkerStatus(
        rank=rank,
        host=_text(beat.get("host")),
        pod=pod,
        plan_id=plan_id,
        phase=phase,
        step=_step(beat, {}),
        last_step_unix=_number(beat.get("last_step_unix")),
        updated_unix=_number(beat.get("updated_unix")) or time.time(),
        files=final.files if final else [],
        error=(final.error if final else None) or _text(beat.get("error")),
        blocked_in=blocked_in(beat),
        **_step_times(beat),
    )
    text = status.model_dump_json()
    previous = state.last_status.get(rank)
    now = time.monotonic()
    if previous is not None:
        previous_phase = json.loads(previous[0]).get("phase")
        if previous[0] == text:
            return
        if previous_phase == phase and now - previous[1] < heartbeat_s:
            return
    destination(plan_id).put_text(layout.worker_key(rank, layout.STATUS), text)
    state.last_status[rank] = (text, now)
