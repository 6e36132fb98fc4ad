"""What a person reads: the verdict block, progress lines, and training failure messages."""

from __future__ import annotations

import io
from typing import Any

from perfdiag.local.failure import failed_ranks, training_failed_message
from perfdiag.local.progress import Progress, status_phase
from perfdiag.local.training import OutputTail
from perfdiag.local.verdict_text import render_verdict


def test_verdict_block_names_status_culprit_and_files(make_verdict: Any, finding: Any) -> None:
    verdict = make_verdict(findings=[finding([2], severity=0.34)])
    text = render_verdict(verdict, location="/tmp/diag/")
    assert text.startswith("perfdiag verdict: DEGRADED")
    assert "Rank 2 is 52% slower" in text
    assert "2: 31.0 <" in text and "0: 20.0 <" not in text
    assert "slow_worker · python · rank 2 · severity 0.34 train.py(40): tokenize" in text
    assert "/tmp/diag/verdict.json" in text and "/tmp/diag/report.html" in text


def test_verdict_block_for_healthy_and_incomplete_runs(make_verdict: Any) -> None:
    healthy = render_verdict(make_verdict(status="healthy"))
    assert "HEALTHY" in healthy and "findings" not in healthy and "<" not in healthy
    incomplete = render_verdict(make_verdict(status="incomplete", missing=(3,)))
    assert "workers not captured: rank 3 missing" in incomplete


def test_many_findings_are_cut_short(make_verdict: Any, finding: Any) -> None:
    verdict = make_verdict(findings=[finding([r % 4], severity=0.5 - r / 100) for r in range(8)])
    assert "… 3 more in verdict.json" in render_verdict(verdict)


def test_progress_skips_repeats_and_rate_limits_status() -> None:
    stream = io.StringIO()
    progress = Progress(stream, min_interval_s=3600)
    progress("a")
    progress("a")
    progress.status("waiting 1")
    progress.status("waiting 2")  # within the interval: not shown
    progress("b")
    assert stream.getvalue().splitlines() == ["perfdiag: a", "perfdiag: waiting 1", "perfdiag: b"]
    quiet = io.StringIO()
    Progress(quiet, quiet=True)("x")
    assert quiet.getvalue() == ""


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _capture_statuses() -> list[tuple[float, str]]:
    """(seconds since start, status) as a 4-rank run polls them every 0.2 s: waiting for the
    ranks, then the window's phases while the steps count on."""
    messages: list[str] = []
    for reporting in (0, 0, 2, 4):
        messages += [f"waiting for 4 ranks to start ({reporting} reporting)…"] * 25
    for step in range(1, 60):
        if step < 5:
            doing = "4 before step 5"
        elif step < 16:
            doing = "4 capturing"
        else:
            doing = "4 writing the trace"
        messages += [f"capturing on 4 ranks: 0 done, {doing} (all at step {step})…"] * 5
    return [(i / 5, message) for i, message in enumerate(messages)]


def _printed(progress: Progress, clock: _Clock, polls: list[tuple[float, str]]) -> list[str]:
    stream = progress.stream
    assert isinstance(stream, io.StringIO)
    for at, message in polls:
        clock.now = 1000.0 + at
        progress.status(message)
    return stream.getvalue().splitlines()


def test_a_log_gets_a_status_line_per_phase_not_per_count() -> None:
    clock = _Clock()
    logged = _printed(Progress(io.StringIO(), clock=clock), clock, _capture_statuses())
    assert logged == [
        "perfdiag: waiting for 4 ranks to start (0 reporting)…",
        "perfdiag: capturing on 4 ranks: 0 done, 4 before step 5 (all at step 1)…",
        "perfdiag: capturing on 4 ranks: 0 done, 4 capturing (all at step 5)…",
        "perfdiag: capturing on 4 ranks: 0 done, 4 writing the trace (all at step 16)…",
        # The same phase for 30 s: said again, so that a log shows perfdiag is alive.
        "perfdiag: capturing on 4 ranks: 0 done, 4 writing the trace (all at step 46)…",
    ]
    # A terminal still sees the counts move (every 2 s at most).
    clock = _Clock()
    terminal = Progress(io.StringIO(), clock=clock, terminal=True)
    shown = _printed(terminal, clock, _capture_statuses())
    assert len(shown) > 20 and shown[:2] == [
        "perfdiag: waiting for 4 ranks to start (0 reporting)…",
        "perfdiag: waiting for 4 ranks to start (2 reporting)…",
    ]


def test_status_phase_ignores_counts_and_details() -> None:
    assert status_phase("capturing on 4 ranks: 1 done, 3 capturing (rank 0: 7, rank 1: 8)…") == (
        status_phase("capturing on 8 ranks: 0 done, 8 capturing (all at step 12)…")
    )
    assert status_phase("watching for a 10% slowdown: step 130, mean step 15.9 ms…") != (
        status_phase("watching for a 10% slowdown: step 12, the baseline needs 50 steps…")
    )


def test_output_tail_keeps_the_last_lines_across_chunks() -> None:
    tail = OutputTail(max_lines=3)
    tail.feed("stdout", b"one\ntw")
    tail.feed("stderr", b"err1\r\n")
    tail.feed("stdout", b"o\nthree\nfour\npartial")
    assert tail.lines() == ["three", "four", "partial"]
    tail.feed("stdout", b"\xff\n")  # undecodable bytes do not break it
    assert tail.lines()[-1] == "partial\ufffd"
    tail.feed("stderr", "é".encode()[:1])  # a character split across two reads
    tail.feed("stderr", "é\n".encode()[1:])
    assert tail.lines()[-1] == "é"


# The failure summary torchrun prints when a worker fails (torch.distributed.elastic).
TORCHRUN_FAILURE = """\
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/tmp/train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2025-11-21_23:47:25
  host      : box
  rank      : 3 (local_rank: 3)
  exitcode  : -15 (pid: 4242)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2025-11-21_23:47:25
  host      : box
  rank      : 1 (local_rank: 1)
  exitcode  : 7 (pid: 4240)
  error_file: <N/A>
============================================================"""


def test_failed_ranks_from_torchrun_summary() -> None:
    lines = TORCHRUN_FAILURE.splitlines()
    assert failed_ranks(lines) == ({3: -15, 1: 7}, 1)
    message = training_failed_message(1, lines, steps_seen=4)
    assert "torchrun exit code 1" in message
    assert "rank 1 exited with code 7 (the first failure), rank 3 exited with code -15" in message
    assert "after 4 steps" in message
    assert "    | /tmp/train.py FAILED" in message


def test_the_first_failure_is_quoted_even_far_above_the_end() -> None:
    own = ["[rank1]: Traceback (most recent call last):", "[rank1]: RuntimeError: boom"]
    noise = [f"[rank3]: noise {i}" for i in range(200)]
    lines = own + noise + TORCHRUN_FAILURE.splitlines()
    message = training_failed_message(1, lines, steps_seen=4)
    assert "Last lines of rank 1:\n    | [rank1]: Traceback" in message
    assert "    | [rank1]: RuntimeError: boom" in message
    assert "noise 5\n" not in message  # the output's tail is cut to its last lines
