"""Hang diagnosis (docs/design.md §4 "Hang"): which ranks hold the job up, and where.

Inputs: the stuck ranks (perfdiag.api.stall), each rank's stack dump (`stacks.json`, the hook's
answer to a `stacks` plan) and, when the job had torch's Flight Recorder on, its dump
(`flight_recorder.pkl`). Method:

1. Each dump's training thread (the one that counts steps; else the main thread) gives a
   signature: its frames (file, function, line), outermost first, and where it waits: the
   public torch.distributed call it is inside (`all_reduce`, `barrier`…), or the autograd engine
   (DDP all-reduces gradients from inside `backward`).
2. Ranks are grouped by signature. The dominant group is the largest; on a tie, the group that
   waits in a collective (with 2 ranks, one waiting and one elsewhere, the other is the culprit).
3. Culprits: ranks outside the dominant group when the dominant group waits in a collective
   (they never reached it); ranks that answer no stack dump (frozen, gone, holding the GIL);
   ranks the Flight Recorder shows behind the collective the others entered (fewer collectives
   issued in a process group). When every rank shares one stack outside any collective, they
   are all stuck in the same place: all are named.
4. Evidence: the culprit's divergent stack (innermost first, from the first frame where it
   leaves the dominant group's stack), the collective the others wait in, the groups.

Pure functions over plain data: the operator calls `diagnose_hang` too.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from perfdiag.api.stall import StuckRank

DISTRIBUTED_PATH = "torch/distributed/"
DATA_PATH = "torch/utils/data/"
AUTOGRAD_WAIT = ("_engine_run_backward", "run_backward")
HOOK_PATH = "perfdiag/collector/"
LIBRARY_PATHS = ("/torch/", HOOK_PATH, "/lib/python", "site-packages", "dist-packages")
"""Frames from these are library code: the location quoted is the user's innermost frame."""
WRAPPERS = frozenset({"wrapper", "inner", "decorator", "wrapped"})
"""torch.distributed's decorators (c10d_logger): not the call the user made."""
STACK_FRAMES_QUOTED = 12
"""Frames of a divergent stack quoted in the evidence (innermost first)."""


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def text(self) -> str:
        return f"{self.file}:{self.line} {self.function}"


@dataclass(frozen=True)
class RankStack:
    rank: int
    frames: tuple[Frame, ...]
    """The training thread, outermost first."""
    thread: str | None

    @property
    def waiting_in(self) -> str | None:
        """The collective it waits in: the outermost public torch.distributed call it is
        inside, or "backward" when it is inside the autograd engine (DDP reduces there)."""
        collective = None
        for frame in self.frames:
            if (
                DISTRIBUTED_PATH in frame.file
                and not frame.function.startswith("_")
                and frame.function not in WRAPPERS
            ):
                collective = frame.function
                break
        if collective is None and self.frames and self.frames[-1].function in AUTOGRAD_WAIT:
            collective = "backward"
        return collective

    @property
    def signature(self) -> tuple[tuple[str, str, int], ...]:
        return tuple((f.file, f.function, f.line) for f in self.frames)


@dataclass(frozen=True)
class FlightRecord:
    """The last collective a rank issued in one process group (from the Flight Recorder)."""

    rank: int
    group: str
    seq: int
    name: str
    state: str


@dataclass(frozen=True)
class Culprit:
    rank: int
    reason: str
    category: str
    """Verdict category: dataloader, communication, python, gc…"""
    stack: list[str] | None
    """Divergent frames, innermost first."""
    location: str | None
    """Its innermost frame outside torch and perfdiag (what the user recognises)."""


@dataclass
class HangDiagnosis:
    stuck: dict[int, StuckRank]
    culprits: list[Culprit]
    waiting: list[int]
    """Ranks waiting for the culprits (the dominant group)."""
    waiting_in: str | None
    """The collective they wait in."""
    waiting_stack: list[str] | None
    groups: list[dict[str, Any]] = field(default_factory=list)
    flight_recorder: list[dict[str, Any]] = field(default_factory=list)
    basis: str = ""

    @property
    def culprit_ranks(self) -> list[int]:
        return sorted(c.rank for c in self.culprits)


def training_stack(dump: Any) -> RankStack | None:
    """The training thread's frames of a stacks.json dump (collector/hook/spool.py), or None."""
    if not isinstance(dump, dict):
        return None
    rank = dump.get("rank")
    threads = dump.get("threads")
    if not isinstance(rank, int) or not isinstance(threads, list):
        return None
    candidates = [t for t in threads if isinstance(t, dict)]
    chosen = next((t for t in candidates if t.get("training") is True), None)
    chosen = chosen or next((t for t in candidates if t.get("main") is True), None)
    chosen = chosen or next((t for t in candidates if t.get("name") == "MainThread"), None)
    if chosen is None:
        return None
    frames = []
    for item in chosen.get("frames") or []:
        if isinstance(item, dict):
            line = item.get("line")
            frames.append(
                Frame(
                    file=str(item.get("file")),
                    line=line if isinstance(line, int) else 0,
                    function=str(item.get("function")),
                )
            )
    name = chosen.get("name")
    return RankStack(rank, tuple(frames), name if isinstance(name, str) else None)


class _PlainUnpickler(pickle.Unpickler):
    """Flight Recorder dumps are dicts, lists, tuples, strings and numbers; refuse anything
    that would import or call code (a pickle is otherwise arbitrary code execution)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name} from a Flight Recorder dump"
        )


def read_flight_recorder(data: bytes) -> dict[str, Any]:
    """torch's Flight Recorder pickle (torch/distributed/flight_recorder: {"version",
    "pg_config", "pg_status", "entries": [...]}) as plain data."""
    loaded = _PlainUnpickler(io.BytesIO(data)).load()
    if not isinstance(loaded, dict) or not isinstance(loaded.get("entries"), list):
        raise ValueError("not a Flight Recorder dump (no 'entries' list)")
    return loaded


def last_collectives(rank: int, dump: Mapping[str, Any]) -> list[FlightRecord]:
    """Per process group, the last collective (highest collective_seq_id) this rank issued."""
    last: dict[str, FlightRecord] = {}
    for entry in dump.get("entries") or []:
        if not isinstance(entry, dict) or entry.get("is_p2p"):
            continue
        seq = entry.get("collective_seq_id")
        group = entry.get("process_group")
        if not isinstance(seq, int):
            continue
        group_id = str(group[0]) if isinstance(group, list | tuple) and group else "?"
        if group_id in last and last[group_id].seq >= seq:
            continue
        last[group_id] = FlightRecord(
            rank=rank,
            group=group_id,
            seq=seq,
            name=str(entry.get("profiling_name")),
            state=str(entry.get("state")),
        )
    return list(last.values())


def behind_in_flight_recorder(
    records: Mapping[int, list[FlightRecord]],
) -> tuple[dict[int, str], list[dict[str, Any]]]:
    """Ranks that issued fewer collectives than their peers in some process group (they never
    entered the one the others wait in) → why; and a per-group summary for the evidence."""
    by_group: dict[str, dict[int, FlightRecord]] = {}
    for rank, items in records.items():
        for record in items:
            by_group.setdefault(record.group, {})[rank] = record
    behind: dict[int, str] = {}
    summary: list[dict[str, Any]] = []
    for group, ranks in sorted(by_group.items()):
        newest = max(r.seq for r in ranks.values())
        ahead = [r for r in ranks.values() if r.seq == newest]
        summary.append(
            {
                "process_group": group,
                "last_seq": {str(rank): r.seq for rank, r in sorted(ranks.items())},
                "newest": {"seq": newest, "collective": ahead[0].name},
            }
        )
        for rank, record in ranks.items():
            if record.seq < newest:
                behind[rank] = (
                    f"the Flight Recorder shows it issued collective #{record.seq} "
                    f"({record.name}) of process group {group!r} last, while ranks "
                    f"{','.join(str(r.rank) for r in sorted(ahead, key=lambda r: r.rank))} "
                    f"entered #{newest} ({ahead[0].name})"
                )
    return behind, summary


def diagnose_hang(
    stuck: Mapping[int, StuckRank],
    dumps: Mapping[int, Any],
    flight_recorders: Mapping[int, Mapping[str, Any]] | None = None,
) -> HangDiagnosis:
    """Name the ranks that hold the job up. `dumps`: rank → stacks.json content;
    `flight_recorders`: rank → read_flight_recorder() of its dump."""
    stacks = {
        rank: stack
        for rank, stack in ((r, training_stack(d)) for r, d in dumps.items())
        if stack is not None and rank in stuck
    }
    groups: dict[tuple[tuple[str, str, int], ...], list[int]] = {}
    for rank, stack in sorted(stacks.items()):
        groups.setdefault(_meaningful(stack).signature, []).append(rank)
    ordered = sorted(
        groups.values(),
        key=lambda ranks: (-len(ranks), stacks[ranks[0]].waiting_in is None, ranks[0]),
    )
    dominant = ordered[0] if ordered else []
    reference = stacks[dominant[0]] if dominant else None
    dominant_waits = reference is not None and reference.waiting_in is not None

    records = {
        rank: last_collectives(rank, dump) for rank, dump in (flight_recorders or {}).items()
    }
    behind, fr_summary = behind_in_flight_recorder(records)

    culprits: dict[int, Culprit] = {}
    for rank in sorted(stuck):
        found = stacks.get(rank)
        if found is None:
            culprits[rank] = Culprit(
                rank=rank,
                reason="it answered no stack dump"
                + (" and its heartbeats stopped" if stuck[rank].silent else "")
                + ": frozen, gone, or holding the GIL in native code (py-spy dump can tell)",
                category="python",
                stack=None,
                location=None,
            )
            continue
        stack = found
        outside = rank not in dominant
        if (outside and dominant_waits) or rank in behind:
            reasons = []
            if outside and reference is not None:
                where = stack.waiting_in
                reasons.append(
                    f"it is not in {reference.waiting_in} with ranks "
                    f"{_ranks_text(dominant)}"
                    + (f" (it waits in {where})" if where and where != reference.waiting_in else "")
                )
            if rank in behind:
                reasons.append(behind[rank])
            culprits[rank] = _culprit(rank, stack, reference, "; ".join(reasons))
    basis = "stacks grouped across ranks"
    if not culprits and dominant and not dominant_waits:
        # Every rank is stuck in the same place, outside any collective.
        for rank in dominant:
            culprits[rank] = _culprit(
                rank, stacks[rank], None, "every stuck rank is stuck here, outside a collective"
            )
        basis = "all stuck ranks share one stack outside any collective"
    if not culprits and stuck and not stacks:
        basis = "no stack dump answered"
    waiting = sorted(r for r in dominant if r not in culprits) if dominant_waits else []
    return HangDiagnosis(
        stuck=dict(stuck),
        culprits=[culprits[r] for r in sorted(culprits)],
        waiting=waiting,
        waiting_in=reference.waiting_in if dominant_waits and reference else None,
        waiting_stack=_innermost(reference.frames) if dominant_waits and reference else None,
        groups=[
            {
                "ranks": ranks,
                "waiting_in": stacks[ranks[0]].waiting_in,
                "top": _innermost(stacks[ranks[0]].frames, 3),
            }
            for ranks in ordered
        ],
        flight_recorder=fr_summary,
        basis=basis + ("; Flight Recorder collective sequence numbers" if records else ""),
    )


def _meaningful(stack: RankStack) -> RankStack:
    """The stack without perfdiag's own frames (a hook frame is not part of the training)."""
    return RankStack(
        stack.rank, tuple(f for f in stack.frames if HOOK_PATH not in f.file), stack.thread
    )


def _culprit(rank: int, stack: RankStack, reference: RankStack | None, reason: str) -> Culprit:
    frames = _meaningful(stack).frames
    shared = 0
    if reference is not None:
        for mine, theirs in zip(frames, _meaningful(reference).frames, strict=False):
            if mine != theirs:
                break
            shared += 1
    divergent = frames[max(shared - 1, 0) :] if shared else frames
    return Culprit(
        rank=rank,
        reason=reason,
        category=_category(frames),
        stack=_innermost(divergent),
        location=_user_location(frames),
    )


def _category(frames: tuple[Frame, ...]) -> str:
    files = [f.file.replace("\\", "/") for f in frames]
    if any(DATA_PATH in f for f in files):
        return "dataloader"
    if any(DISTRIBUTED_PATH in f for f in files):
        return "communication"
    return "python"


def _user_location(frames: tuple[Frame, ...]) -> str | None:
    for frame in reversed(frames):
        path = frame.file.replace("\\", "/")
        if not any(part in path for part in LIBRARY_PATHS) and not path.startswith("<"):
            return frame.text()
    return frames[-1].text() if frames else None


def _innermost(frames: tuple[Frame, ...], limit: int = STACK_FRAMES_QUOTED) -> list[str]:
    return [f.text() for f in reversed(frames[-limit:])]


def _ranks_text(ranks: list[int]) -> str:
    return ",".join(str(r) for r in ranks)
