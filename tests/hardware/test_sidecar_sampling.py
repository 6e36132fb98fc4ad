"""The sidecar agent samples hardware while a rank has a window armed, open or being written,
and stops when none is (collector/agent.py run_agent)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from perfdiag.collector.agent import AgentState, run_agent
from perfdiag.collector.hook import spool
from perfdiag.storage.local import LocalStorage


def _beat(spool_dir: Path, rank: int, phase: str) -> None:
    spool.write_json_atomic(
        spool.rank_dir(spool_dir, rank) / spool.HEARTBEAT,
        {
            "rank": rank,
            "local_rank": rank,
            "pid": os.getpid(),
            "step": 5,
            "last_step_unix": time.time(),
            "updated_unix": time.time(),
            "phase": phase,
            "plan_id": None,
        },
    )


def _wait(condition: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_sampler_runs_only_while_a_window_is_open(tmp_path: Path) -> None:
    spool_dir = tmp_path / "spool"
    for rank in (0, 1):
        _beat(spool_dir, rank, "dormant")
    state = AgentState()
    stop = threading.Event()
    loop = threading.Thread(
        target=run_agent,
        args=(spool_dir, LocalStorage(tmp_path / "out")),
        kwargs={"stop": stop, "poll_s": 0.05, "state": state},
        daemon=True,
    )
    loop.start()
    try:
        time.sleep(0.3)
        assert state.sampler is None  # dormant ranks: nothing sampled
        _beat(spool_dir, 1, "armed")
        _wait(lambda: state.sampler is not None, "the sampler to start")
        sampler = state.sampler
        assert sampler is not None
        _beat(spool_dir, 1, "capturing")
        time.sleep(0.3)
        assert state.sampler is sampler  # one sampler for the whole window
        _wait(lambda: any(s.metric == "net_rx_bytes" for s in sampler.samples()), "samples")
        _beat(spool_dir, 1, "dormant")
        _wait(lambda: state.sampler is None, "the sampler to stop")
    finally:
        stop.set()
        loop.join(timeout=10)
    assert not loop.is_alive()
