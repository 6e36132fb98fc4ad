"""The agent: a real spool window (torch.profiler in a subprocess) → worker files in storage."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest

from perfdiag.api.plan import Plan
from perfdiag.api.schema import EVENTS_SCHEMA_ID, SUMMARY_SCHEMA_ID, read_meta
from perfdiag.api.worker import WorkerStatus
from perfdiag.cli import main as cli_main
from perfdiag.collector.agent import (
    AgentState,
    _plan_file_id,
    process_window,
    run_agent,
    window_complete,
)
from perfdiag.collector.hook import spool
from perfdiag.engine.parquet_io import table_from_bytes
from perfdiag.storage import open_storage
from perfdiag.storage.local import LocalStorage


def status_of(storage: LocalStorage, rank: int = 0) -> WorkerStatus:
    return WorkerStatus.model_validate_json(storage.get_text(f"workers/{rank}/status.json"))


def test_window_round_trip(spool_copy: Path, tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "diag")
    assert window_complete(spool_copy, 0, "p1")
    assert not window_complete(spool_copy, 0, "other-plan")
    assert not window_complete(spool_copy, 1, "p1")

    status = process_window(spool_copy, 0, "p1", storage, pod="pod-a")
    assert status.phase == "done" and status.error is None
    assert status.files == ["workers/0/events.parquet", "workers/0/summary.parquet"]
    assert status.step == 8 and status.pod == "pod-a" and status.plan_id == "p1"
    assert status_of(storage) == status

    events = table_from_bytes(storage.get_bytes("workers/0/events.parquet"))
    meta = read_meta(events.schema, EVENTS_SCHEMA_ID)
    assert (meta.rank, meta.source, meta.pod, meta.window.id) == (0, "hook", "pod-a", "p1")
    assert (meta.window.start_step, meta.window.steps) == (4, 4)  # step 3 was the warm-up
    assert meta.python_stacks and not meta.has_gpu and meta.torch_version
    summary = table_from_bytes(storage.get_bytes("workers/0/summary.parquet"))
    assert read_meta(summary.schema, SUMMARY_SCHEMA_ID) == meta
    assert abs(pc.sum(summary["beta"]).as_py() - 1) < 1e-6
    categories = set(summary["category"].to_pylist())
    assert {"cpu_op", "python", "dataloader", "gc", "idle"} <= categories


def test_gc_pause_lands_where_the_trace_saw_gc_collect(spool_copy: Path, tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "diag")
    process_window(spool_copy, 0, "p1", storage)
    events = table_from_bytes(storage.get_bytes("workers/0/events.parquet"))
    gc_events = events.filter(pc.equal(events["category"], "gc"))
    collect = gc_events.filter(pc.equal(gc_events["name"], "gc.collect(gen=2)")).to_pylist()
    assert len(collect) == 1 and collect[0]["step"] == 1  # the gc.collect() of step 5
    # The trace's own Python event for the gc.collect() call must contain the pause.
    calls = events.filter(pc.equal(events["name"], "<built-in function collect>")).to_pylist()
    assert len(calls) == 1
    pause, call = collect[0], calls[0]
    slack = 2_000_000  # 2 ms: the two clocks are matched at step boundaries
    assert call["ts_ns"] - slack <= pause["ts_ns"]
    assert pause["ts_ns"] + pause["dur_ns"] <= call["ts_ns"] + call["dur_ns"] + slack
    assert pause["dur_ns"] > 0.5 * call["dur_ns"]
    summary = table_from_bytes(storage.get_bytes("workers/0/summary.parquet")).to_pylist()
    gc_row = next(r for r in summary if r["function"] == "gc.collect(gen=2)")
    assert gc_row["category"] == "gc" and gc_row["beta_per_step"][1] > 0.3
    assert gc_row["beta_per_step"][0] == gc_row["beta_per_step"][2] == 0


def test_no_raw_events_when_not_kept(spool_copy: Path, tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "diag")
    status = process_window(spool_copy, 0, "p1", storage, keep_raw=False)
    assert status.files == ["workers/0/summary.parquet"]
    assert not storage.exists("workers/0/events.parquet")


def test_hook_error_gives_a_failed_status(spool_copy: Path, tmp_path: Path) -> None:
    hook_path = spool.window_dir(spool_copy, 0, "p1") / spool.HOOK_META
    hook = json.loads(hook_path.read_text())
    hook["error"] = "torch.profiler failed to start: boom"
    hook_path.write_text(json.dumps(hook))
    storage = LocalStorage(tmp_path / "diag")
    status = process_window(spool_copy, 0, "p1", storage)
    assert status.phase == "failed" and "boom" in (status.error or "")
    assert status_of(storage).phase == "failed"
    assert not storage.exists("workers/0/summary.parquet")


def test_malformed_trace_gives_a_failed_status_naming_the_file(
    spool_copy: Path, tmp_path: Path
) -> None:
    trace = spool.window_dir(spool_copy, 0, "p1") / spool.TRACE
    trace.write_bytes(trace.read_bytes()[:5000])
    storage = LocalStorage(tmp_path / "diag")
    status = process_window(spool_copy, 0, "p1", storage)
    assert status.phase == "failed"
    assert str(trace) in (status.error or "") and "not valid JSON" in (status.error or "")


def test_stack_dump_is_uploaded(spool_copy: Path, tmp_path: Path) -> None:
    dump = {"rank": 0, "pid": 1, "host": "h", "time_unix": 1.0, "step": 8, "threads": []}
    spool.write_json_atomic(spool.stacks_file(spool_copy, 0, "p1"), dump)
    storage = LocalStorage(tmp_path / "diag")
    status = process_window(spool_copy, 0, "p1", storage)
    assert "workers/0/stacks.json" in status.files
    assert json.loads(storage.get_text("workers/0/stacks.json")) == dump


def test_run_agent_processes_each_window_once(spool_copy: Path, tmp_path: Path) -> None:
    base = LocalStorage(tmp_path / "store")
    state = run_agent(spool_copy, base, stop=threading.Event(), once=True)
    assert state.processed == {(0, "p1")}
    diag = LocalStorage(tmp_path / "store" / "p1")
    assert status_of(diag).phase == "done"
    record = json.loads(spool.uploaded_window_mark(spool_copy, 0, "p1").read_text())
    assert record["status"]["phase"] == "done"
    assert not spool.window_dir(spool_copy, 0, "p1").exists()  # uploaded: out of the spool
    # A restarted agent (fresh memory) neither re-uploads nor downgrades the status.
    diag.delete("workers/0/summary.parquet")
    again = run_agent(spool_copy, base, stop=threading.Event(), once=True)
    assert again.processed == set()
    assert not diag.exists("workers/0/summary.parquet")
    assert status_of(diag).phase == "done"


def test_an_uploaded_window_left_in_the_spool_is_removed_not_uploaded(
    spool_copy: Path, tmp_path: Path
) -> None:
    """An agent stopped between its upload record and the removal: the next one removes the
    window's files, uploads nothing again and reports the recorded outcome."""
    window = spool.window_dir(spool_copy, 0, "p1")
    done = WorkerStatus(rank=0, plan_id="p1", phase="done", updated_unix=1.0, files=["f"])
    record = {"storage": "x", "time_unix": 1.0, "status": done.model_dump(mode="json")}
    spool.write_json_atomic(spool.uploaded_window_mark(spool_copy, 0, "p1"), record)
    store = LocalStorage(tmp_path / "store")
    state = run_agent(spool_copy, store, stop=threading.Event(), once=True)
    assert state.processed == set() and state.kept == set()
    assert not window.exists()
    diag = LocalStorage(tmp_path / "store" / "p1")
    assert not diag.exists("workers/0/summary.parquet")
    assert status_of(diag).phase == "done" and status_of(diag).files == ["f"]


def test_an_uploaded_stack_dump_leaves_the_spool(spool_copy: Path, tmp_path: Path) -> None:
    dump = {"rank": 0, "pid": 1, "host": "h", "time_unix": 1.0, "step": 8, "threads": []}
    spool.write_json_atomic(spool.stacks_file(spool_copy, 0, "s1"), dump)
    spool.write_bytes_atomic(spool.flight_recorder_file(spool_copy, 0, "s1"), b"pickle")
    state = run_agent(
        spool_copy, LocalStorage(tmp_path / "store"), stop=threading.Event(), once=True
    )
    assert (0, "s1") in state.stacks
    stored = LocalStorage(tmp_path / "store" / "s1")
    assert json.loads(stored.get_text("workers/0/stacks.json")) == dump
    assert stored.get_bytes("workers/0/flight_recorder.pkl") == b"pickle"
    assert spool.uploaded_stacks_mark(spool_copy, 0, "s1").is_file()
    assert list((spool.rank_dir(spool_copy, 0) / "stacks").iterdir()) == []


def test_heartbeats_follow_the_plan_file_and_phase(spool_copy: Path, tmp_path: Path) -> None:
    base = LocalStorage(tmp_path / "store")
    plan_file = tmp_path / "plan.json"
    # The plan as writers write it: the agent reads it as strictly as the hook does.
    plan_file.write_text(Plan.new(plan_id="p2", steps=3).to_json())
    beat_path = spool.rank_dir(spool_copy, 0) / spool.HEARTBEAT
    beat = json.loads(beat_path.read_text())
    state = AgentState()
    run_agent(spool_copy, base, stop=threading.Event(), once=True, plan_file=plan_file, state=state)
    p2 = LocalStorage(tmp_path / "store" / "p2")
    first = status_of(p2)
    assert first.plan_id == "p2" and first.phase == "dormant" and first.step == beat["step"]
    # The hook takes the plan: the phase change is uploaded at once.
    beat.update(phase="capturing", plan_id="p2", step=beat["step"] + 1, updated_unix=time.time())
    spool.write_json_atomic(beat_path, beat)
    run_agent(spool_copy, base, stop=threading.Event(), once=True, plan_file=plan_file, state=state)
    assert status_of(p2).phase == "capturing" and status_of(p2).step == beat["step"]
    # Same phase, new step, within the heartbeat period: not uploaded yet.
    beat.update(step=beat["step"] + 1)
    spool.write_json_atomic(beat_path, beat)
    run_agent(
        spool_copy,
        base,
        stop=threading.Event(),
        once=True,
        plan_file=plan_file,
        state=state,
        heartbeat_s=3600,
    )
    assert status_of(p2).step == beat["step"] - 1
    run_agent(
        spool_copy,
        base,
        stop=threading.Event(),
        once=True,
        plan_file=plan_file,
        state=state,
        heartbeat_s=0,
    )
    assert status_of(p2).step == beat["step"]


def test_a_watch_plan_in_the_pods_annotations_gets_the_step_times(
    spool_copy: Path, tmp_path: Path
) -> None:
    """On Kubernetes the plan file is the pod's plan annotation, projected alone by the
    downward API; a `watch` plan is only there (the hook names no plan in its heartbeat), and its
    statuses carry the hook's mean and longest step for the slowdown trigger."""
    base = LocalStorage(tmp_path / "store")
    plan_file = tmp_path / "plan"
    plan_file.write_text(Plan.new(plan_id="d-uid-watch", action="watch", steps=20).to_json())
    beat_path = spool.rank_dir(spool_copy, 0) / spool.HEARTBEAT
    beat = json.loads(beat_path.read_text())
    beat.update(mean_step_ms=52.5, max_step_ms=80.0, mean_steps=20, updated_unix=time.time())
    spool.write_json_atomic(beat_path, beat)
    run_agent(spool_copy, base, stop=threading.Event(), once=True, plan_file=plan_file)
    status = status_of(LocalStorage(tmp_path / "store" / "d-uid-watch"))
    assert (status.plan_id, status.phase) == ("d-uid-watch", "dormant")
    assert (status.mean_step_ms, status.max_step_ms, status.mean_steps) == (52.5, 80.0, 20)


def test_storage_errors_are_retried_until_storage_comes_back(
    spool_copy: Path, tmp_path: Path
) -> None:
    root = tmp_path / "store"
    root.write_text("a file where the storage folder should be")  # every write fails
    base = LocalStorage(root)
    stop = threading.Event()
    state = AgentState()
    thread = threading.Thread(
        target=run_agent,
        args=(spool_copy, base),
        kwargs=dict(stop=stop, poll_s=0.02, max_backoff_s=0.1, state=state),
    )
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not state.retries and time.monotonic() < deadline:
            time.sleep(0.02)
        assert state.retries, "the failing upload was not scheduled for a retry"
        assert thread.is_alive()
        root.unlink()
        while (0, "p1") not in state.processed and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert (0, "p1") in state.processed
    assert status_of(LocalStorage(root / "p1")).phase == "done"


def test_cli_agent_once(
    spool_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_main(
        [
            "agent",
            "--spool",
            str(spool_copy),
            "--storage",
            str(tmp_path / "s"),
            "--once",
            "--no-raw",
        ]
    )
    assert code == 0
    storage = open_storage(tmp_path / "s" / "p1")
    assert storage.exists("workers/0/summary.parquet")
    assert not storage.exists("workers/0/events.parquet")
    assert (
        cli_main(
            [
                "agent",
                "--spool",
                str(tmp_path / "missing"),
                "--storage",
                str(tmp_path / "s"),
                "--once",
            ]
        )
        == 1
    )
    assert "does not exist" in capsys.readouterr().err


def test_processing_time_is_small(spool_copy: Path, tmp_path: Path) -> None:
    started = time.perf_counter()
    process_window(spool_copy, 0, "p1", LocalStorage(tmp_path / "diag"))
    elapsed = time.perf_counter() - started
    # A 4-step window of a small model (a few thousand events): well under the time of a
    # training step of a real job, even on a loaded CI machine.
    assert elapsed < 10, elapsed


def test_sidecar_process_uploads_and_stops_on_sigterm(spool_copy: Path, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    store = tmp_path / "store"
    command = [
        sys.executable,
        "-m",
        "perfdiag.cli",
        "agent",
        "--spool",
        str(spool_copy),
        "--storage",
        str(store),
        "--poll",
        "0.1",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        status = store / "p1" / "workers" / "0" / "status.json"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            if status.exists() and json.loads(status.read_text())["phase"] == "done":
                break
            time.sleep(0.1)
        assert process.poll() is None, process.communicate()
        assert json.loads(status.read_text())["phase"] == "done"
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert "rank 0: window p1 done" in err
    assert (store / "p1" / "workers" / "0" / "summary.parquet").is_file()


def test_a_plan_the_hook_rejects_gets_no_statuses(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan"
    plan_file.write_text(Plan.new(plan_id="ok-plan", steps=3).to_json())
    assert _plan_file_id(plan_file) == "ok-plan"
    # Lenient JSON the model would accept, but not the canonical form the hook reads.
    plan_file.write_text(json.dumps({"id": "p3", "action": "capture", "steps": "3"}))
    assert _plan_file_id(plan_file) is None
    plan_file.write_text("")  # a pod without a plan annotation
    assert _plan_file_id(plan_file) is None


def test_the_agent_mirrors_its_pods_plan_from_storage(tmp_path: Path) -> None:
    """The operator writes the pod's plan to <namespace storage>/pod-plans/<uid>.json; the
    agent copies it into the spool (empty when there is none) and touches the copy at every
    read, which keeps the hooks reading it; a read that fails leaves the copy to go stale."""
    from perfdiag.collector.pod_plan import PodPlanFollower
    from perfdiag.storage import StorageUnavailable

    storage = LocalStorage(tmp_path / "ns")
    spool_dir = tmp_path / "spool"
    follower = PodPlanFollower(storage, "uid-1", spool_dir)
    mirror = spool.agent_plan_file(spool_dir)
    assert follower.poll_once() and mirror.read_bytes() == b""  # no plan yet
    plan = Plan.new(plan_id="d-uid-watch", action="watch", steps=10)
    storage.put_text("pod-plans/uid-1.json", plan.to_json())
    assert follower.poll_once() and mirror.read_text() == plan.to_json()
    assert spool.plan_source(spool_dir, tmp_path / "kubelet-plan", time.time()) == mirror
    # The agent's statuses follow the plan of its copy (the kubelet's file is still empty).
    (tmp_path / "kubelet-plan").write_text("")
    from perfdiag.collector.agent import _current_plan

    assert _current_plan(spool_dir, 0, tmp_path / "kubelet-plan") == "d-uid-watch"
    # Unchanged: touched, not rewritten.
    then = time.time() - 20
    os.utime(mirror, (then, then))
    inode = mirror.stat().st_ino
    assert follower.poll_once()
    assert mirror.stat().st_ino == inode and time.time() - mirror.stat().st_mtime < 5
    # Removed by the operator: an empty copy.
    storage.delete("pod-plans/uid-1.json")
    assert follower.poll_once() and mirror.read_bytes() == b""
    # Storage unreachable: the copy is left as it was, to go stale.
    os.utime(mirror, (then, then))

    def unreachable(key: str) -> bytes:
        raise StorageUnavailable("connection refused")

    follower.storage.get_bytes = unreachable  # type: ignore[method-assign]
    assert not follower.poll_once()
    assert mirror.stat().st_mtime == pytest.approx(then)


def test_the_agent_gives_its_hooks_the_successor_of_its_pods_watch_plan(tmp_path: Path) -> None:
    """The operator ends a watch with one write, the watch plan's successor: an agent told to
    follow successors mirrors the plan found there while its pod's object holds that watch
    plan, and its pod's own object again once that holds another plan (or none)."""
    from perfdiag.api.plan import plan_successor_key
    from perfdiag.collector.pod_plan import PodPlanFollower
    from perfdiag.storage import StorageUnavailable

    storage = LocalStorage(tmp_path / "ns")
    spool_dir = tmp_path / "spool"
    mirror = spool.agent_plan_file(spool_dir)
    watch = Plan.new(plan_id="d-uid-watch", action="watch", steps=10)
    capture = Plan.new(plan_id="d-uid", steps=5)
    storage.put_text("pod-plans/uid-1.json", watch.to_json())
    following = PodPlanFollower(storage, "uid-1", spool_dir, follow_successors=True)
    assert following.poll_once() and mirror.read_text() == watch.to_json()  # no successor yet
    storage.put_text(plan_successor_key(watch.id), capture.to_json())
    assert following.poll_once() and mirror.read_text() == capture.to_json()
    # An agent not told to (injected by an earlier perfdiag) keeps to its pod's object.
    assert PodPlanFollower(storage, "uid-1", spool_dir).current_plan() == watch.to_json().encode()
    # Only a watch plan has a successor: a pod given a plan of its own takes it.
    stacks = Plan.new(plan_id="d-uid-stacks", action="stacks", steps=1)
    storage.put_text("pod-plans/uid-1.json", stacks.to_json())
    assert following.poll_once() and mirror.read_text() == stacks.to_json()
    storage.delete("pod-plans/uid-1.json")
    assert following.poll_once() and mirror.read_bytes() == b""
    # The successor unreadable: the copy is left as it was, to go stale.
    storage.put_text("pod-plans/uid-1.json", watch.to_json())
    assert following.poll_once() and mirror.read_text() == capture.to_json()
    real_get = storage.get_bytes

    def successor_unreachable(key: str) -> bytes:
        if key.startswith("plan-successors/"):
            raise StorageUnavailable("connection refused")
        return real_get(key)

    following.storage.get_bytes = successor_unreachable  # type: ignore[method-assign]
    then = time.time() - 20
    os.utime(mirror, (then, then))
    assert not following.poll_once()
    assert mirror.stat().st_mtime == pytest.approx(then)


def test_the_agent_follows_successors_when_the_webhook_marks_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--plan-successors` defaults to $PERFDIAG_PLAN_SUCCESSORS being 1, which the webhook sets
    on the agents it injects and the operator then relies on."""
    from perfdiag.cli import build_parser

    argv = ["agent", "--spool", "spool", "--storage", "store"]
    monkeypatch.delenv("PERFDIAG_PLAN_SUCCESSORS", raising=False)
    assert not build_parser("agent").parse_args(argv).plan_successors
    assert build_parser("agent").parse_args([*argv, "--plan-successors"]).plan_successors
    monkeypatch.setenv("PERFDIAG_PLAN_SUCCESSORS", "0")
    assert not build_parser("agent").parse_args(argv).plan_successors
    monkeypatch.setenv("PERFDIAG_PLAN_SUCCESSORS", "1")
    assert build_parser("agent").parse_args(argv).plan_successors


def test_the_agent_loop_follows_the_pods_plan_and_removes_its_copy_when_it_stops(
    tmp_path: Path,
) -> None:
    from perfdiag.collector.pod_plan import PodPlanFollower

    storage = LocalStorage(tmp_path / "ns")
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    storage.put_text("pod-plans/uid-2.json", Plan.new(plan_id="cap", steps=3).to_json())
    stop = threading.Event()
    follower = PodPlanFollower(storage, "uid-2", spool_dir, poll_s=0.05)
    agent = threading.Thread(
        target=run_agent, args=(spool_dir, storage), kwargs={"stop": stop, "pod_plan": follower}
    )
    agent.start()
    mirror = spool.agent_plan_file(spool_dir)
    deadline = time.monotonic() + 10
    while not mirror.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert '"cap"' in mirror.read_text()
    stop.set()
    agent.join(10)
    assert not mirror.exists()
