"""The hook and the agent as different users, as in a pod: the training runs as root (common in
training images) under a restrictive umask, the agent as the perfdiag image's user 10001. The
agent records its uploads in a folder of its own, removes what it uploaded from the spool, and
a restart of either side neither uploads nor captures again; the spool stays bounded however
many diagnoses run.

The agent runs in a forked child that drops to uid/gid 10001 (this suite runs as root): not a
fresh interpreter, because this machine's Python and its packages live where that user cannot
read them. Everything the agent imports lazily is imported first by one pass as root on a copy
of the spool."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from perfdiag.api.plan import Plan
from perfdiag.collector import agent
from perfdiag.collector.hook import spool
from perfdiag.storage.local import LocalStorage

pytestmark = pytest.mark.slow

AGENT_UID = 10001  # the image's user (Dockerfile, the chart's runAsUser)
DIAGNOSES = 6
KEPT_RECORDS = 3  # instead of agent.KEPT_RECORDS, so that 6 diagnoses show the pruning


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder both users reach (pytest's tmp_path is root's alone): the spool, as an emptyDir
    (world-writable), the plan file, and the agent's storage, owned by the agent's user."""
    root = Path(tempfile.mkdtemp(prefix="perfdiag-owners-"))
    root.chmod(0o755)
    (root / "spool").mkdir(mode=0o777)
    (root / "spool").chmod(0o777)
    (root / "store").mkdir()
    os.chown(root / "store", AGENT_UID, AGENT_UID)
    yield root
    shutil.rmtree(root, ignore_errors=True)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def agent_pass(spool_dir: Path, store: Path, plan_file: Path) -> dict[str, Any]:
    """One pass of the sidecar's loop (a restarted agent: nothing in memory); what it did and
    the warnings it logged."""
    collect = _Collect()
    logger = logging.getLogger("perfdiag.agent")
    logger.addHandler(collect)
    try:
        state = agent.run_agent(
            spool_dir, LocalStorage(store), stop=threading.Event(), once=True, plan_file=plan_file
        )
    finally:
        logger.removeHandler(collect)
    return {
        "uid": os.getuid(),
        "processed": sorted(plan for _, plan in state.processed),
        "phases": {plan: status.phase for (_, plan), status in state.final.items()},
        "kept": sorted(plan for _, _, plan in state.kept),
        "warnings": collect.lines,
    }


def as_user(uid: int, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`work()` in a forked child running as uid/gid `uid` with no other groups."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            answer = json.dumps(work())
            code = 0
        except BaseException:
            answer = traceback.format_exc()
        with os.fdopen(write_end, "w") as out:
            out.write(answer)
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as answers:
        answer = answers.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the agent as uid {uid} failed:\n{answer}"
    result: dict[str, Any] = json.loads(answer)
    return result


def files_in(folder: Path) -> dict[str, int]:
    """Every file under `folder` (relative path → size)."""
    return {
        str(path.relative_to(folder)): path.stat().st_size
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_agent_of_another_user_marks_removes_and_keeps_the_spool_bounded(
    hooked: Any, shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool_dir, store, plan_file = shared / "spool", shared / "store", shared / "plan"
    monkeypatch.setattr(agent, "KEPT_RECORDS", KEPT_RECORDS)
    run = dataclasses.replace(hooked, spool=spool_dir, plan=plan_file)
    args = ("--steps", "100000", "--step-sleep", "0.01")
    last = f"diag-{DIAGNOSES - 1}"
    umask = os.umask(0o077)  # the training's: its files would be its own alone
    try:
        training = run.start(*args)
    finally:
        os.umask(umask)
    try:
        sizes = []
        for index in range(DIAGNOSES):
            plan_id = f"diag-{index}"
            run.write_plan(Plan.new(plan_id=plan_id, steps=2))
            run.wait_hook_meta(plan_id)
            window = spool.window_dir(spool_dir, 0, plan_id)
            assert_shared_by_the_hook(window)
            if index == 0:  # every lazy import, before dropping privileges
                scratch = hooked.tmp / "warm-up"
                shutil.copytree(spool_dir, scratch / "spool")
                agent_pass(scratch / "spool", scratch / "store", plan_file)
            done = as_user(AGENT_UID, lambda: agent_pass(spool_dir, store, plan_file))
            assert done["uid"] == AGENT_UID
            assert done["processed"] == [plan_id] and done["phases"] == {plan_id: "done"}, done
            assert done["warnings"] == [] and done["kept"] == [], done
            status = json.loads((store / plan_id / "workers/0/status.json").read_text())
            assert status["phase"] == "done" and status["files"], status
            record = spool.uploaded_window_mark(spool_dir, 0, plan_id)
            assert record.stat().st_uid == AGENT_UID
            assert json.loads(record.read_text())["status"]["phase"] == "done"
            assert not window.exists()  # uploaded: out of the spool
            sizes.append(sum(files_in(spool_dir).values()))

        # Bounded: the heartbeat and the newest upload records, whatever the number of windows.
        records = sorted(files_in(spool_dir / spool.AGENT_DIR))
        newest = [f"diag-{i}" for i in range(DIAGNOSES - KEPT_RECORDS, DIAGNOSES)]
        assert records == [f"rank-0/windows/{plan}.json" for plan in newest], records
        assert sorted(files_in(spool_dir)) == [
            *[f"agent/{path}" for path in records],
            "rank-0/heartbeat.json",
        ]
        assert max(sizes) < 16_000 and sizes[-1] - sizes[KEPT_RECORDS] < 200, sizes

        # A restarted agent uploads nothing again, and keeps the outcome in the status.
        summary = store / last / "workers/0/summary.parquet"
        summary.unlink()
        again = as_user(AGENT_UID, lambda: agent_pass(spool_dir, store, plan_file))
        assert again["processed"] == [] and again["warnings"] == [], again
        assert not summary.exists()
        status = json.loads((store / last / "workers/0/status.json").read_text())
        assert status["phase"] == "done", status
    finally:
        training.proc.kill()
        training.finish()

    # A restarted training, the last plan still in its plan file: not captured again.
    restarted = run.start(*args)
    try:
        run.wait_until(
            lambda: (
                run.heartbeat().get("pid") == restarted.proc.pid
                and run.heartbeat().get("step", 0) >= 20
            ),
            "the restarted training's 20th step",
        )
        assert not spool.window_dir(spool_dir, 0, last).exists()
        assert restarted.hook_log() == []
    finally:
        restarted.proc.kill()
        restarted.finish()


def assert_shared_by_the_hook(window: Path) -> None:
    """Folders rwx for all, files readable by all, owned by the training's user (root)."""
    for folder in (window, window.parent, window.parent.parent):
        mode = stat.S_IMODE(folder.stat().st_mode)
        assert mode == spool.DIR_MODE, f"{folder}: {mode:o}"
    for name in (spool.TRACE, spool.HOOK_META):
        info = (window / name).stat()
        assert stat.S_IMODE(info.st_mode) == spool.FILE_MODE and info.st_uid == 0, name
    beat = window.parent.parent / spool.HEARTBEAT
    assert stat.S_IMODE(beat.stat().st_mode) == spool.FILE_MODE
