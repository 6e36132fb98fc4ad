"""analyzer/load/hang.py: grouping stack dumps across ranks, naming the ranks that hold the job up,
and reading torch Flight Recorder dumps (real dumps from a gloo job)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from perfdiag.analyzer.load.hang import (
    behind_in_flight_recorder,
    diagnose_hang,
    last_collectives,
    read_flight_recorder,
    training_stack,
)
from perfdiag.api.stall import StuckRank

HERE = Path(__file__).resolve().parent
TORCH = "/venv/lib/python3.11/site-packages/torch"
MAIN = [("/job/train.py", 90, "<module>"), ("/job/train.py", 61, "main")]
ALL_REDUCE = [
    (f"{TORCH}/distributed/c10d_logger.py", 83, "wrapper"),
    (f"{TORCH}/distributed/distributed_c10d.py", 4174, "all_reduce"),
]
LOADER = [
    ("/job/train.py", 55, "next_batch"),
    (f"{TORCH}/utils/data/dataloader.py", 733, "__next__"),
    (f"{TORCH}/utils/data/dataloader.py", 789, "_next_data"),
    (f"{TORCH}/utils/data/_utils/fetch.py", 52, "fetch"),
    ("/job/data.py", 20, "__getitem__"),
    ("/usr/lib/python3.11/threading.py", 629, "wait"),
]
BACKWARD = [
    (f"{TORCH}/_tensor.py", 625, "backward"),
    (f"{TORCH}/autograd/__init__.py", 354, "backward"),
    (f"{TORCH}/autograd/graph.py", 841, "_engine_run_backward"),
]


def dump(rank: int, *frames: tuple[str, int, str]) -> dict[str, Any]:
    return {
        "rank": rank,
        "threads": [
            {
                "name": "MainThread",
                "main": True,
                "training": True,
                "frames": [{"file": f, "line": line, "function": fn} for f, line, fn in frames],
            },
            {"name": "perfdiag-hook", "main": False, "frames": []},
        ],
    }


def stuck(*ranks: int, silent: tuple[int, ...] = ()) -> dict[int, StuckRank]:
    return {r: StuckRank(r, 31, 120.0, r in silent) for r in ranks}


def test_the_rank_in_its_data_loader_holds_up_the_ranks_in_all_reduce() -> None:
    dumps = {r: dump(r, *MAIN, *ALL_REDUCE) for r in (0, 2, 3)}
    dumps[1] = dump(1, *MAIN, *LOADER)
    result = diagnose_hang(stuck(0, 1, 2, 3), dumps)
    assert result.culprit_ranks == [1]
    assert result.waiting == [0, 2, 3]
    assert result.waiting_in == "all_reduce"
    culprit = result.culprits[0]
    assert culprit.category == "dataloader"
    assert culprit.location == "/job/data.py:20 __getitem__"  # the user's innermost frame
    # The divergent stack, innermost first, from where it left the others' stack.
    assert culprit.stack is not None
    assert culprit.stack[0].endswith("threading.py:629 wait")
    assert culprit.stack[-1] == "/job/train.py:61 main"
    assert [g["ranks"] for g in result.groups] == [[0, 2, 3], [1]]


def test_two_ranks_the_one_outside_the_collective_is_the_culprit() -> None:
    dumps = {0: dump(0, *MAIN, ("/job/train.py", 70, "checkpoint")), 1: dump(1, *MAIN, *ALL_REDUCE)}
    result = diagnose_hang(stuck(0, 1), dumps)
    assert result.culprit_ranks == [0]
    assert result.waiting == [1]
    assert result.culprits[0].category == "python"


def test_ddp_ranks_waiting_in_backward_name_the_rank_elsewhere() -> None:
    dumps = {r: dump(r, *MAIN, *BACKWARD) for r in range(4)}
    dumps[3] = dump(3, *MAIN, ("/job/train.py", 40, "tokenize"))
    result = diagnose_hang(stuck(0, 1, 2, 3), dumps)
    assert result.culprit_ranks == [3]
    assert result.waiting_in == "backward"


def test_all_ranks_stuck_in_one_place_outside_a_collective_are_all_named() -> None:
    dumps = {r: dump(r, *MAIN, *LOADER) for r in range(3)}
    result = diagnose_hang(stuck(0, 1, 2), dumps)
    assert result.culprit_ranks == [0, 1, 2]
    assert result.waiting == []
    assert "share one stack" in result.basis


def test_a_rank_without_a_stack_dump_is_named_and_said_to_be_silent() -> None:
    dumps = {r: dump(r, *MAIN, *ALL_REDUCE) for r in (0, 1)}
    result = diagnose_hang(stuck(0, 1, 2, silent=(2,)), dumps)
    assert result.culprit_ranks == [2]
    assert "heartbeats stopped" in result.culprits[0].reason
    assert result.culprits[0].stack is None


def test_everyone_in_the_same_collective_names_nobody_without_more_evidence() -> None:
    dumps = {r: dump(r, *MAIN, *ALL_REDUCE) for r in range(4)}
    result = diagnose_hang(stuck(0, 1, 2, 3), dumps)
    assert result.culprits == []
    assert result.waiting == [0, 1, 2, 3]


def test_training_stack_prefers_the_thread_that_steps() -> None:
    data = dump(0, *MAIN)
    data["threads"].insert(
        0, {"name": "worker", "main": False, "training": False, "frames": [{"file": "a"}]}
    )
    stack = training_stack(data)
    assert stack is not None and stack.thread == "MainThread"
    assert training_stack({"rank": "x"}) is None
    assert training_stack(None) is None


@pytest.fixture(scope="module")
def real_flight_recorder(tmp_path_factory: pytest.TempPathFactory) -> dict[int, bytes]:
    """Real dumps of a 3-rank gloo job in which rank 1 did not issue the last all-reduce."""
    out = tmp_path_factory.mktemp("fr")
    subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", "3", str(HERE / "fr_dump_job.py"), str(out), "1",
        ],
        check=True, timeout=180, capture_output=True,
    )  # fmt: skip
    return {r: (out / f"rank-{r}.pkl").read_bytes() for r in range(3)}


def test_real_flight_recorder_dumps_name_the_rank_behind(
    real_flight_recorder: dict[int, bytes],
) -> None:
    dumps = {r: read_flight_recorder(data) for r, data in real_flight_recorder.items()}
    records = {r: last_collectives(r, d) for r, d in dumps.items()}
    assert [len(items) for items in records.values()] == [1, 1, 1]  # one process group
    seqs = {r: items[0].seq for r, items in records.items()}
    assert seqs[0] == seqs[2] == seqs[1] + 1
    assert records[0][0].name.endswith("all_reduce")
    behind, summary = behind_in_flight_recorder(records)
    assert list(behind) == [1]
    assert summary[0]["newest"]["seq"] == seqs[0]
    # Same Python stacks everywhere (as with NCCL, where every rank waits in the same call):
    # the Flight Recorder alone singles rank 1 out.
    stacks = {r: dump(r, *MAIN, *ALL_REDUCE) for r in range(3)}
    result = diagnose_hang(stuck(0, 1, 2), stacks, dumps)
    assert result.culprit_ranks == [1]
    assert "Flight Recorder" in result.culprits[0].reason


def test_pickled_structure_of_the_documented_format_reads_the_same() -> None:
    """A dump built with the structure torch/distributed/flight_recorder reads ("entries" with
    process_group, collective_seq_id, profiling_name, state), pickled as torch does."""
    entries = [
        {
            "record_id": i,
            "pg_id": 0,
            "process_group": ("0", "default_pg"),
            "collective_seq_id": i + 1,
            "p2p_seq_id": 0,
            "profiling_name": "nccl:all_reduce",
            "state": "completed" if i < 4 else "started",
            "is_p2p": False,
            "frames": [],
        }
        for i in range(5)
    ]
    data = pickle.dumps({"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": entries})
    records = last_collectives(0, read_flight_recorder(data))
    assert [(r.seq, r.state) for r in records] == [(5, "started")]


class _Payload:
    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("owned",))


def test_a_pickle_that_would_run_code_is_refused() -> None:
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        read_flight_recorder(pickle.dumps({"entries": [_Payload()]}))
    with pytest.raises(ValueError, match="not a Flight Recorder dump"):
        read_flight_recorder(pickle.dumps([1, 2]))


def test_without_stack_dumps_the_heartbeats_innermost_frames_are_used(tmp_path: Path) -> None:
    import time

    from perfdiag.analyzer import analyze
    from perfdiag.api.worker import BlockedIn, WorkerStatus
    from perfdiag.storage import layout
    from perfdiag.storage.local import LocalStorage

    storage = LocalStorage(tmp_path)
    now = time.time()
    waiting = BlockedIn(
        file=f"{TORCH}/distributed/distributed_c10d.py",
        line=4174,
        function="all_reduce",
        collective="all_reduce",
    )
    elsewhere = BlockedIn(file="/job/data.py", line=20, function="read_shard")
    for rank in range(3):
        status = WorkerStatus(
            rank=rank,
            step=12,
            last_step_unix=now - 300,
            updated_unix=now,
            blocked_in=elsewhere if rank == 2 else waiting,
        )
        storage.put_text(layout.worker_key(rank, layout.STATUS), status.model_dump_json())
    verdict = analyze(storage)
    assert verdict.status == "hang"
    hang = verdict.findings[0]
    assert hang.ranks == [2], verdict.to_json()
    assert hang.evidence["waiting"]["collective"] == "all_reduce"
    assert "heartbeats' innermost frames" in hang.evidence["basis"]


def test_a_rank_whose_heartbeats_stopped_during_a_hang_is_named(tmp_path: Path) -> None:
    import json
    import time

    from perfdiag.analyzer import analyze
    from perfdiag.api.worker import WorkerStatus
    from perfdiag.storage import layout
    from perfdiag.storage.local import LocalStorage

    storage = LocalStorage(tmp_path)
    now = time.time()
    for rank in range(3):
        # Ranks 0 and 1 wait in all_reduce and answer; rank 2 went silent right as it stopped
        # (a native call holding the GIL): no heartbeat for 5 minutes, no stack dump.
        updated = now - 300 if rank == 2 else now
        status = WorkerStatus(rank=rank, step=12, last_step_unix=now - 301, updated_unix=updated)
        storage.put_text(layout.worker_key(rank, layout.STATUS), status.model_dump_json())
        if rank != 2:
            storage.put_text(
                layout.worker_key(rank, layout.STACKS), json.dumps(dump(rank, *MAIN, *ALL_REDUCE))
            )
    verdict = analyze(storage)
    assert verdict.status == "hang"
    assert {w.rank: w.state for w in verdict.workers} == {0: "stuck", 1: "stuck", 2: "stuck"}
    hang = verdict.findings[0]
    assert hang.ranks == [2], verdict.to_json()
    assert "heartbeats stopped" in hang.evidence["culprits"][0]["reason"]
    assert hang.evidence["waiting"]["ranks"] == [0, 1]


def test_a_stack_dump_at_the_same_step_is_newer_evidence_than_the_status(tmp_path: Path) -> None:
    """The operator asks for stacks once ranks are stuck by its own clock; their status.json
    heartbeat can be seconds older (uploaded at most every few seconds). Each dump carries the
    time and step it was taken at: at the status' step it shows the rank still stuck then; at a
    later step it shows the rank moved on, and adds nothing."""
    import json
    import time

    from perfdiag.analyzer import analyze
    from perfdiag.api.thresholds import Thresholds
    from perfdiag.api.worker import WorkerStatus
    from perfdiag.storage import layout
    from perfdiag.storage.local import LocalStorage

    storage = LocalStorage(tmp_path)
    now = time.time()
    for rank in range(4):
        # Heartbeat 6 s after the last step: short of the 10 s limit by itself.
        status = WorkerStatus(rank=rank, step=40, last_step_unix=now - 13, updated_unix=now - 7)
        storage.put_text(layout.worker_key(rank, layout.STATUS), status.model_dump_json())
        frames = (*MAIN, *LOADER) if rank == 3 else (*MAIN, *ALL_REDUCE)
        taken = {"step": 41 if rank == 1 else 40, "time_unix": now - 1}
        storage.put_text(
            layout.worker_key(rank, layout.STACKS), json.dumps({**dump(rank, *frames), **taken})
        )
    verdict = analyze(storage, thresholds=Thresholds(stuck_after_seconds=10))
    states = {w.rank: w.state for w in verdict.workers}
    assert states == {0: "stuck", 1: "missing", 2: "stuck", 3: "stuck"}, verdict.to_json()
    assert verdict.status == "hang"
    assert verdict.findings[0].ranks == [3], verdict.to_json()
