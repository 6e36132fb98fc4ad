"""Two `perfdiag run` processes acting as the two nodes of one job (static rendezvous on this
host), writing into one shared output: the node with rank 0 writes the verdict for all four
ranks."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from perfdiag.demo.scenarios import TRAIN_SCRIPT


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_two_nodes_one_verdict(tmp_path: Path, verdict_of: Any) -> None:
    out, stop = tmp_path / "shared", tmp_path / "stop"
    port = str(_free_port())
    nodes = []
    for node in (0, 1):
        argv = [
            sys.executable, "-m", "perfdiag.cli", "run",
            "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", port,
            "--out", str(out), "--no-keep-raw",
            "--", str(TRAIN_SCRIPT), "--scenario", "python-hotspot", "--fault-rank", "3",
            "--stop-file", str(stop),
        ]  # fmt: skip
        log = (tmp_path / f"node{node}.log").open("w")
        nodes.append(subprocess.Popen(argv, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT))
    try:
        deadline = time.monotonic() + 240
        while not (out / "verdict.json").exists() and time.monotonic() < deadline:
            assert all(node.poll() is None for node in nodes), _logs(tmp_path)
            time.sleep(0.5)
        stop.touch()  # the training may end now
        codes = [node.wait(timeout=120) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert codes == [0, 0], _logs(tmp_path)

    verdict = verdict_of(out)
    assert [(w.rank, w.state) for w in verdict.workers] == [(r, "ok") for r in range(4)]
    assert verdict.status == "degraded", verdict.to_json()
    assert verdict.findings[0].ranks == [3] and verdict.findings[0].category == "python"
    node0, node1 = (tmp_path / "node0.log").read_text(), (tmp_path / "node1.log").read_text()
    assert "perfdiag verdict: DEGRADED" in node0
    assert "the node running rank 0 writes the verdict" in node1
    assert "perfdiag verdict" not in node1
    for rank in range(4):
        assert (out / "workers" / str(rank) / "summary.parquet").is_file()
        assert not (out / "workers" / str(rank) / "events.parquet").exists()  # --no-keep-raw


def _logs(tmp_path: Path) -> str:
    return "\n".join(f"--- node {n}\n{(tmp_path / f'node{n}.log').read_text()}" for n in (0, 1))
