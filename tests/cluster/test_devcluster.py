"""`make cluster` (perfdiag_testing.devcluster): started as a user starts it, used with the
kubeconfig it prints, stopped with SIGTERM, leaving no process, port or folder behind."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest
import yaml

from perfdiag_testing.binaries import find_bin_dir
from perfdiag_testing.devcluster import KUBEFLOW, READY_LINE

pytestmark = pytest.mark.cluster

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 180


def _descendants(root: int) -> set[int]:
    """Every live process below `root` (by parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _read_lines(stream: IO[str], lines: list[str]) -> None:
    for line in stream:
        lines.append(line)


def test_make_cluster_serves_a_diagnosis_and_stops_cleanly() -> None:
    process = subprocess.Popen(
        [sys.executable, "-P", "-m", "perfdiag_testing.devcluster"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    assert process.stdout is not None
    threading.Thread(target=_read_lines, args=(process.stdout, lines), daemon=True).start()
    try:
        started = time.monotonic()
        while not any(READY_LINE in line for line in lines):
            assert process.poll() is None, "".join(lines)
            assert time.monotonic() - started < READY_TIMEOUT_S, "".join(lines)
            time.sleep(0.2)
        ready_s = time.monotonic() - started
        output = "".join(lines)
        kubeconfig = Path(re.search(r"KUBECONFIG=(\S+)", output).group(1))  # type: ignore[union-attr]
        assert "operator: running" in output, output
        assert "kubectl get perfdiagnosis" in output, output
        workdir = Path(re.search(r"state in (\S+)", output).group(1))  # type: ignore[union-attr]
        server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        _use_it(kubeconfig)
        children = _descendants(process.pid)
        assert children, "make cluster started no process"
        stopping = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(90) == 0, "".join(lines)
        stop_s = time.monotonic() - stopping
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert "stopped; state removed" in "".join(lines)
    left = [pid for pid in children if _alive(pid)]
    assert not left, f"processes left after SIGTERM: {left}"
    assert not workdir.exists()
    host, port = server.removeprefix("https://").rsplit(":", 1)
    with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=2):
        pass  # the apiserver's port is released
    print(f"\nmake cluster: ready in {ready_s:.1f} s, stopped in {stop_s:.1f} s", flush=True)


def _use_it(kubeconfig: Path) -> None:
    """A user's first steps with the printed kubeconfig: an opted-in PyTorchJob and a
    PerfDiagnosis of it; the webhook injects its pods, the operator resolves it."""
    kubectl = str(find_bin_dir(("kubectl",), repo_root=REPO_ROOT) / "kubectl")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}

    def run(*args: str, input: str | None = None) -> str:
        done = subprocess.run(
            [kubectl, *args], input=input, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    job = yaml.safe_load((KUBEFLOW / "example-cpu-demo.yaml").read_text())
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        replica["template"].setdefault("metadata", {})["labels"] = {"perfdiag.io/inject": "true"}
    run("apply", "-f", "-", input=json.dumps(job))
    diagnosis = yaml.safe_load((REPO_ROOT / "docs/examples/pytorchjob.yaml").read_text())
    diagnosis["spec"]["target"]["name"] = job["metadata"]["name"]
    run("apply", "-f", "-", input=json.dumps(diagnosis))
    name = diagnosis["metadata"]["name"]
    deadline = time.monotonic() + 60
    while True:
        status = json.loads(run("get", "perfdiagnosis", name, "-o", "json")).get("status") or {}
        resolved = [c for c in status.get("conditions") or [] if c["type"] == "TargetResolved"]
        if status.get("phase") and resolved and resolved[0]["status"] == "True":
            break
        assert time.monotonic() < deadline, f"no status from the operator: {status}"
        time.sleep(1)
    pods = json.loads(run("get", "pods", "-o", "json"))["items"]
    assert len(pods) == 2, pods
    for pod in pods:  # injected by the operator's webhook
        assert [c["name"] for c in pod["spec"]["initContainers"]] == [
            "perfdiag-hook", "perfdiag-agent"
        ]  # fmt: skip
