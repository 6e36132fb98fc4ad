"""The fault classes of the fault suite and how a verdict is judged against each.

Each class runs `tests/support/perfdiag_testing/fault_job.py` through `perfdiag run` exactly as a user runs a
training script; `benchmarks/fault_suite.py` repeats them (quiet and beside a CPU hog) and
tabulates, and tests/analyzer/test_fault_suite.py asserts a fast subset.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from perfdiag.api import Verdict
from perfdiag_testing.processes import free_port
from perfdiag_testing.verdict_agreement import disagreements

FAULT_JOB = Path(__file__).with_name("fault_job.py")
CULPRIT_KINDS = frozenset({"slow_worker", "hardware", "function_anomaly", "slow_node"})


@dataclass(frozen=True)
class FaultClass:
    name: str
    fault: str
    ranks: int
    culprits: tuple[int, ...] = ()
    """Ranks that must be named; () for a class with no culprit."""
    categories: frozenset[str] = frozenset()
    """Categories a culprit's finding may carry."""
    function: str | None = None
    """A substring the culprit finding's function must contain (the user's code)."""
    kind: str | None = None
    """A finding kind that must be reported (e.g. imbalance); None: culprits decide."""
    job_args: tuple[str, ...] = ()
    needs_root: bool = False
    nodes: int = 1
    """Local "nodes": one `perfdiag run` each (--nnodes, --node-rank), all on this host, each
    with its own PERFDIAG_NODE_NAME (node-0, node-1, …), as a multi-node job's nodes run it."""
    fast: bool = False
    """Part of the subset the test suite runs."""

    @property
    def healthy(self) -> bool:
        return not self.culprits and self.kind is None


def _c(*names: str) -> frozenset[str]:
    return frozenset(names)


CLASSES: tuple[FaultClass, ...] = (
    FaultClass("healthy", "healthy", 4, fast=True),
    FaultClass("healthy-pair", "healthy", 2),
    FaultClass("noisy-steps", "noisy-steps", 4),
    FaultClass("python-hotspot", "python-hotspot", 4, (2,), _c("python"), "tokenize", fast=True),
    FaultClass("two-python", "python-hotspot", 4, (1, 3), _c("python"), "tokenize"),
    FaultClass("mixed-causes", "mixed", 4, (1, 3), _c("python", "cpu_op")),
    FaultClass(
        "compute",
        "compute",
        4,
        (2,),
        _c("cpu_op"),
        job_args=("--extra-repeats", "24"),
        fast=True,
    ),
    FaultClass(
        "graded-3",
        "graded",
        3,
        (1, 2),
        _c("cpu_op"),
        job_args=("--scale", "1.5,3", "--base-repeats", "40"),
    ),
    FaultClass(
        "graded-4",
        "graded",
        4,
        (2, 3),
        _c("cpu_op"),
        job_args=("--scale", "2.5,4", "--base-repeats", "24"),
    ),
    FaultClass("larger-batch", "larger-batch", 4, (1,), _c("cpu_op", "python", "dataloader")),
    FaultClass("intermittent", "intermittent", 4, (2,), _c("python"), "tokenize"),
    FaultClass("gil-thread", "gil-thread", 4, (2,), _c("host", "python")),
    FaultClass("sleep", "sleep", 4, (2,), _c("python", "host"), "flush_metrics", fast=True),
    FaultClass("dataset", "dataset", 4, (2,), _c("dataloader"), "decode_record"),
    FaultClass("loader-worker", "loader-worker", 4, (2,), _c("dataloader")),
    FaultClass("cpu-quota", "cpu-quota", 4, (2,), _c("host"), needs_root=True),
    FaultClass("checkpoint", "checkpoint", 4, (0,), _c("python", "cpu_op"), "save_checkpoint"),
    FaultClass("logging", "logging", 4, (0,), _c("python"), "write_metrics_record"),
    FaultClass("threads", "threads", 4, (2,), _c("host", "cpu_op")),
    FaultClass("memory", "memory", 4, (2,), _c("python", "host"), "cache_features"),
    FaultClass("uneven", "uneven", 4, kind="imbalance"),
    FaultClass(
        "slow-node",
        "slow-node",
        4,
        (2, 3),
        _c("cpu_op"),
        kind="slow_node",
        job_args=("--extra-repeats", "24"),
        nodes=2,
        fast=True,
    ),
)
BY_NAME = {c.name: c for c in CLASSES}


@dataclass
class Outcome:
    fault_class: str
    right: bool
    why: str
    status: str
    named: list[int] = field(default_factory=list)
    top: str = ""
    seconds: float = 0.0
    out: str = ""


def judge(fault_class: FaultClass, verdict: Verdict) -> tuple[bool, str]:
    """Does the verdict say what the class injected — every culprit, the right category and
    function, nobody else — or, for a healthy class, nothing at all?"""
    findings = list(verdict.findings)
    named = sorted({r for f in findings if f.kind in CULPRIT_KINDS for r in f.ranks})
    if fault_class.healthy:
        if verdict.status == "healthy" and not findings:
            return True, "healthy, nothing reported"
        first = findings[0] if findings else None
        what = f"{first.kind} {first.category} ranks {first.ranks}" if first else "no finding"
        return False, f"false alarm: {verdict.status}, {what}"
    if fault_class.kind is not None:
        wanted = [f for f in findings if f.kind == fault_class.kind]
        if not wanted:
            return False, f"no {fault_class.kind} finding (status {verdict.status}, named {named})"
        stray = [r for r in named if r not in fault_class.culprits]
        if stray:
            return False, f"{fault_class.kind} found, but ranks {stray} named as culprits"
        return True, f"{fault_class.kind}: {wanted[0].message[:80]}"
    missing = [r for r in fault_class.culprits if r not in named]
    stray = [r for r in named if r not in fault_class.culprits]
    if missing or stray:
        return False, f"named {named}, expected {list(fault_class.culprits)}"
    for rank in fault_class.culprits:
        mine = [f for f in findings if f.kind in CULPRIT_KINDS and rank in f.ranks]
        top = mine[0]
        if fault_class.categories and top.category not in fault_class.categories:
            return (
                False,
                f"rank {rank}: category {top.category}, expected {sorted(fault_class.categories)}",
            )
        if fault_class.function and not any(
            fault_class.function in (f.function or "") for f in mine
        ):
            return False, f"rank {rank}: function {top.function!r}, expected {fault_class.function}"
    return True, "every culprit named with its cause"


def reanalyze(fault_class: FaultClass, capture: Path, *, perfdiag: str | None = None) -> Outcome:
    """Judge an earlier run's capture again with this perfdiag: `perfdiag analyze CAPTURE --out
    CAPTURE/reanalysis` in a fresh process, as a user re-analyses a capture."""
    out = capture / "reanalysis"
    argv = [
        perfdiag or str(Path(sys.executable).with_name("perfdiag")),
        "analyze",
        str(capture),
        "--out",
        str(out),
        "--quiet",
    ]
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    return _judged(fault_class, out / "verdict.json", proc, time.monotonic() - started, capture)


def _judged(
    fault_class: FaultClass,
    verdict_file: Path,
    proc: subprocess.CompletedProcess[str],
    seconds: float,
    out: Path,
) -> Outcome:
    if not verdict_file.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return Outcome(
            fault_class.name,
            False,
            f"no verdict (rc {proc.returncode}): {' | '.join(tail)}",
            "none",
            seconds=seconds,
            out=str(out),
        )
    verdict = Verdict.model_validate(json.loads(verdict_file.read_text()))
    right, why = judge(fault_class, verdict)
    report = verdict_file.with_name("report.html")
    # A verdict must also agree with itself: the same number wherever it is given.
    disagree = disagreements(verdict, report.read_text()) if report.exists() else ["no report"]
    if right and disagree:
        right, why = False, f"the verdict disagrees with itself: {'; '.join(disagree)}"
    top = verdict.findings[0] if verdict.findings else None
    return Outcome(
        fault_class.name,
        right,
        why,
        verdict.status,
        named=sorted({r for f in verdict.findings if f.kind in CULPRIT_KINDS for r in f.ranks}),
        top=f"{top.kind} · {top.category} · {top.ranks} · {top.function}" if top else "",
        seconds=seconds,
        out=str(out),
    )


def run_class(
    fault_class: FaultClass,
    out: Path,
    *,
    perfdiag: str | None = None,
    timeout_s: float = 300.0,
    capture_steps: int = 10,
) -> Outcome:
    """One run of one class through `perfdiag run`, as a user types it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="perfdiag-fault-") as scratch:
        stop_file = Path(scratch) / "stop"
        return _run(fault_class, out, stop_file, perfdiag, timeout_s, capture_steps)


def _run(
    fault_class: FaultClass,
    out: Path,
    stop_file: Path,
    perfdiag: str | None,
    timeout_s: float,
    capture_steps: int,
) -> Outcome:
    fault_ranks = ",".join(map(str, fault_class.culprits))
    nodes = fault_class.nodes
    port = free_port()

    def node_options(node: int) -> list[str]:
        if nodes == 1:
            return []
        return ["--nnodes", str(nodes), "--node-rank", str(node), "--master-addr", "127.0.0.1",
                "--master-port", str(port)]  # fmt: skip

    argv = [
        perfdiag or str(Path(sys.executable).with_name("perfdiag")),
        "run",
        "--nproc-per-node",
        str(fault_class.ranks // nodes),
        "--out",
        str(out),
        "--capture-steps",
        str(capture_steps),
        "--quiet",
        "--",
        str(FAULT_JOB),
        "--fault",
        fault_class.fault,
        "--fault-ranks",
        fault_ranks,
        "--stop-file",
        str(stop_file),
        "--max-seconds",
        str(timeout_s),
        *fault_class.job_args,
    ]
    verdict_file = out / "verdict.json"
    started = time.monotonic()
    done = threading.Event()

    def stop_when_verdict() -> None:
        # The job trains until the verdict is out, however fast or loaded the host is.
        while not done.wait(0.2):
            if verdict_file.exists():
                stop_file.touch()
                return

    threading.Thread(target=stop_when_verdict, daemon=True).start()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    runs = [
        subprocess.Popen(
            [*argv[:2], *node_options(node), *argv[2:]],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "PERFDIAG_NODE_NAME": f"node-{node}"} if nodes > 1 else env,
        )
        for node in range(nodes)
    ]
    try:
        # The node with global rank 0 (node 0) writes the verdict; the others end with it.
        outputs = [run.communicate(timeout=timeout_s + 60) for run in runs]
    except subprocess.TimeoutExpired:
        return Outcome(fault_class.name, False, "perfdiag run timed out", "timeout", out=str(out))
    finally:
        done.set()
        stop_file.touch()
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
    proc = subprocess.CompletedProcess(argv, runs[0].returncode, *outputs[0])
    return _judged(fault_class, verdict_file, proc, time.monotonic() - started, out)
