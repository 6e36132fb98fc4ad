"""The profiler's native log lines are kept out of the terminal; the training's own output
passes through byte for byte and at once."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from perfdiag.local.native_log import NATIVE_LOG_HINT, NativeLog, NoiseFilter
from perfdiag.local.output import Output, open_output, wrap_up_output
from perfdiag.storage import open_storage

# What torch's profiler prints on a CPU machine when a window starts and stops.
USDT_START = (
    b"USDT:2026-11-25 01:51:29 1927:1927 SyncActivityProfilerHandler.cpp:39] profiler_start"
)
USDT_STOP = b"USDT:2026-11-25 01:51:31 1924:1924 SyncActivityProfilerHandler.cpp:46] profiler_stop"
GPU_PROBE = (
    b"ERROR:2026-11-25 01:51:31 1924:1924 DeviceProperties.cpp:56] "
    b"gpuGetDeviceCount failed with code 35"
)
STAGE = (
    b"STAGE:2023-10-02 12:00:01 77:77 ActivityProfilerController.cpp:312] Completed Stage: Warm Up"
)
# c10 ends every warning with the function that raised it (c10::WarningHandler::process).
C10_PROFILER = (
    b"[rank0]:[W1125 01:51:31.123456789 collection.cpp:1050] Warning: Failed to recover "
    b"relationship between all profiler and kineto events (function operator())"
)
NOISE = [USDT_START, USDT_STOP, GPU_PROBE, STAGE, C10_PROFILER]

USER = [
    b"epoch 1 loss 0.25",
    b"ERROR: my data loader lost a shard",  # the user's own: not glog-shaped
    b"ERROR:2026-11-25 the date is not a log header",
    b"[W] a warning of the user's",
    b"[INFO] profiler enabled for step 3",
    b"USDT: user text",
    # torch's own C++ logging about something else than the profiler stays visible.
    b"[W1125 01:51:31.123456789 ProcessGroupNCCL.cpp:1168] Warning: process group has NOT been "
    b"destroyed",
    b"caf\xc3\xa9 \xff\xfe not UTF-8",
]
# The user's own Python warning and its source line, and a traceback through the hook's step
# call (Ctrl-C while it ran): the user's, shown.
USER += [
    b"/home/me/train.py:12: UserWarning: the learning rate is high",
    b"  warnings.warn('the learning rate is high')",
    b'  File "/tmp/pd/hook/perfdiag/collector/hook/__init__.py", line 170, in optimizer_step',
]


def _run(chunks: list[bytes]) -> tuple[bytes, bytes, list[bytes]]:
    """(all shown, all routed, what each feed showed)."""
    noise = NoiseFilter()
    shown, routed, each = b"", b"", []
    for chunk in chunks:
        now, logged = noise.feed(chunk)
        shown, routed = shown + now, routed + logged
        each.append(now)
    now, logged = noise.finish()
    return shown + now, routed + logged, each


def test_noise_lines_go_to_the_log_and_user_lines_stay() -> None:
    user = b"".join(line + b"\n" for line in USER)
    mixed = b"".join(line + b"\n" for pair in zip(USER, NOISE * 3, strict=False) for line in pair)
    shown, routed, _ = _run([mixed])
    assert shown == user
    assert routed == b"".join(line + b"\n" for line in (NOISE * 3)[: len(USER)])


def test_progress_bars_pass_through_at_once() -> None:
    bars = [f"\r{p:3d}%|{'#' * (p // 10):<10}| {p}/100 [00:01<00:02]".encode() for p in (10, 20)]
    noise = NoiseFilter()
    for bar in bars:
        assert noise.feed(bar) == (bar, b"")
    # The profiler's line lands after an unfinished bar: the bar stays, the line is logged.
    assert noise.feed(USDT_START + b"\n") == (b"", USDT_START + b"\n")
    assert noise.feed(b"\r 40%|####") == (b"\r 40%|####", b"")


def test_partial_lines_across_chunks() -> None:
    stream = b"step 1\npartial " + GPU_PROBE + b"\nstep 2 [W] done\n" + C10_PROFILER + b"\nend"
    user = b"step 1\npartial step 2 [W] done\nend"
    for cut in range(1, len(stream)):
        shown, routed, _ = _run([stream[:cut], stream[cut:]])
        assert shown == user, cut
        assert routed == GPU_PROBE + b"\n" + C10_PROFILER + b"\n", cut
    shown, routed, each = _run([bytes([byte]) for byte in stream])
    assert (shown, routed) == (user, GPU_PROBE + b"\n" + C10_PROFILER + b"\n")
    # Byte by byte, only what may still be a header waits: "step 1\n" shows as it comes.
    assert b"".join(each[:7]) == b"step 1\n"


@pytest.mark.parametrize(
    ("lines", "ends"),
    [
        # Anything glued together, torch's C++ lines and Python's warnings aside…
        (
            [line for line in USER if not line.startswith((b"[W1", b"/home/me/train.py"))],
            [b"\n", b"\r", b" ", b""],
        ),
        # …which end at their newline, or where a progress bar's \r comes between.
        (USER, [b"\n", b"\r", b"\r\n"]),
    ],
)
def test_user_output_is_unchanged_whatever_the_chunks(
    lines: list[bytes], ends: list[bytes]
) -> None:
    rng = random.Random(7)
    user = b"".join(rng.choice(lines) + rng.choice(ends) for _ in range(300))
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(user)), 40))
        chunks = [user[a:b] for a, b in zip([0, *cuts], [*cuts, len(user)], strict=True)]
        shown, routed, _ = _run(chunks)
        assert (shown, routed) == (user, b"")


def test_messages_of_two_ranks_on_one_line() -> None:
    # Kineto writes the message, then its newline: two ranks at the same moment give
    # "A" "B" "\n" "\n", and the second newline may come after further messages.
    chunks = [USDT_STOP, USDT_STOP, b"\n", GPU_PROBE, b"\n", GPU_PROBE, b"\n", b"\n", b"user\n\n"]
    shown, routed, _ = _run(chunks)
    assert shown == b"user\n\n"
    assert routed.count(b"\n") == 4 and b"user" not in routed


def test_an_unfinished_header_at_the_end_is_shown() -> None:
    assert _run([b"loading CSV"]) == (b"loading CSV", b"", [b"loading CS"])
    assert _run([b"last words USDT:2026"])[:2] == (b"last words USDT:2026", b"")
    assert _run([USDT_STOP])[:2] == (b"", USDT_STOP)  # killed before its newline


# Warnings about perfdiag's own code: a Python warning raised in the hook (with the source line
# Python prints under it), one torch raised from the profiler's C++ code while the hook's thread
# ran, and torch's C++ warnings naming the hook, one of them on two lines.
HOOK_FILE = b"/tmp/pd/hook/perfdiag/collector/hook/__init__.py"
PERFDIAG_WARNINGS = [
    HOOK_FILE + b":496: ResourceWarning: unclosed file <_io.TextIOWrapper name=3>\n"
    b"  spool.write_json_atomic(self.rank_dir / spool.HEARTBEAT, beat)\n",
    HOOK_FILE + b":496: UserWarning: Python replay stack is empty during pop operation! May "
    b"result in incorrect stack tracing. (Triggered internally at /pytorch/torch/csrc/autograd/"
    b"profiler_python.cpp:1386.)\n",
    b"/home/me/train.py:40: UserWarning: Python replay stack is empty during pop operation! "
    b"(Triggered internally at /pytorch/torch/csrc/autograd/profiler_python.cpp:1386.)\n"
    b"  loss.backward()\n",
    b"[rank1]:[W1127 13:21:26.123456789 profiler_python.cpp:1386] Warning: Unexpected exit of\n"
    b"[rank1]:  perfdiag/collector/hook/__init__.py(473): _write_heartbeat (function operator())\n",
    b"[W1127 13:21:26.123456789 python_tracer.cpp:77] Warning: frame "
    b"perfdiag/collector/hook/__init__.py(473): _write_heartbeat exited twice (function pop)\n",
]


def test_warnings_about_perfdiags_own_code_go_to_the_log() -> None:
    user = b"".join(line + b"\n" for line in USER)
    mixed = b"".join(
        line + b"\n" + warning for line, warning in zip(USER, PERFDIAG_WARNINGS * 3, strict=False)
    ) + b"".join(line + b"\n" for line in USER[len(PERFDIAG_WARNINGS) * 3 :])
    routed_all = b"".join((PERFDIAG_WARNINGS * 3)[: len(USER)])
    assert _run([mixed])[:2] == (user, routed_all)
    for cut in range(1, len(mixed), 7):  # however the reads cut it
        assert _run([mixed[:cut], mixed[cut:]])[:2] == (user, routed_all), cut
    assert _run([bytes([byte]) for byte in mixed])[:2] == (user, routed_all)


def test_a_warnings_source_line_is_taken_only_when_it_follows() -> None:
    warning = PERFDIAG_WARNINGS[1]  # no source line under it: the next line is the user's
    for tail in (b"epoch 2\n", b"[rank0]:epoch 2\n", b" 1/9\r 2/9\r"):
        assert _run([warning, tail[:1], tail[1:]])[:2] == (tail, warning)
    assert _run([warning, USDT_STOP + b"\n"])[:2] == (b"", warning + USDT_STOP + b"\n")
    # Killed right after the source line began: it is the warning's still.
    source = PERFDIAG_WARNINGS[0]
    assert _run([source[:-1]])[:2] == (b"", source[:-1])


def test_native_log_file_is_made_on_the_first_line(tmp_path: Path) -> None:
    path = tmp_path / "perfdiag-native.log"
    log = NativeLog(path)
    log.write(b"")
    assert not path.exists() and log.written is None
    log.write(USDT_START + b"\n" + USDT_STOP + b"\n")
    log.close()
    assert path.read_bytes() == USDT_START + b"\n" + USDT_STOP + b"\n"
    assert log.lines == 2 and log.written == path
    assert str(path) in log.where()
    dropped = NativeLog(None)
    dropped.write(GPU_PROBE + b"\n")
    assert dropped.lines == 1 and dropped.written is None
    assert "native log (1 line) was not kept (the output is not a local folder)" in dropped.where()


HARNESS = """
import os, sys
from pathlib import Path
from perfdiag.local.native_log import NativeLog
from perfdiag.local.training import TrainingProcess
log = NativeLog(Path(sys.argv[2]) if sys.argv[2] != "-" else None)
training = TrainingProcess([sys.executable, "-c", sys.argv[1]], dict(os.environ),
                           stdout_to_stderr=False, native_log=None if sys.argv[2] == "-" else log)
assert training.wait(30) == 0
log.close()
"""
CHILD = f"""
import sys
sys.stdout.write("out: 1\\r out: 2\\r out: 3\\n")
sys.stderr.write("err: tqdm 10%\\r")
sys.stderr.flush()
sys.stderr.buffer.write({USDT_START!r} + b"\\n" + {GPU_PROBE!r} + b"\\n")
sys.stderr.write("err: tqdm 20%\\nerr: done\\n")
sys.stdout.write({USDT_STOP!r}.decode() + "\\n")  # stdout is not filtered
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_training_output_is_filtered_on_stderr_only(tmp_path: Path, verbose: bool) -> None:
    log = tmp_path / "perfdiag-native.log"
    result = subprocess.run(
        [sys.executable, "-c", HARNESS, CHILD, "-" if verbose else str(log)],
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert result.stdout == b"out: 1\r out: 2\r out: 3\n" + USDT_STOP + b"\n"
    if verbose:
        assert GPU_PROBE in result.stderr and not log.exists()
    else:
        assert result.stderr == b"err: tqdm 10%\rerr: tqdm 20%\nerr: done\n"
        assert log.read_bytes() == USDT_START + b"\n" + GPU_PROBE + b"\n"


def test_a_run_without_capture_leaves_no_folder_it_made(tmp_path: Path) -> None:
    said: list[str] = []
    output = open_output(str(tmp_path / "new" / "diag"), shared=False)
    assert output.created == tmp_path / "new"
    output.storage.put_text("plan.json", "{}")
    log = NativeLog(tmp_path / "new" / "diag" / "perfdiag-native.log")
    log.write(USDT_START + b"\n")
    wrap_up_output(output, log, said.append, failed=True)
    assert not (tmp_path / "new").exists()
    assert said == [
        f"nothing was captured: removed {tmp_path / 'new' / 'diag'}, which perfdiag had created"
        ", with the profiler's native log; -v prints it in the terminal"
    ]


def test_a_folder_that_was_there_or_holds_a_capture_stays(tmp_path: Path) -> None:
    said: list[str] = []
    (tmp_path / "mine").mkdir()
    existing = open_output(str(tmp_path / "mine"), shared=False)
    assert existing.created is None
    wrap_up_output(existing, NativeLog(None), said.append, failed=True)
    assert (tmp_path / "mine").is_dir() and said == []

    made = open_output(str(tmp_path / "diag"), shared=False)
    made.storage.put_text("workers/0/status.json", "{}")
    log = NativeLog(tmp_path / "diag" / "perfdiag-native.log")
    log.write(GPU_PROBE + b"\n")
    wrap_up_output(made, log, said.append, failed=True)
    assert (tmp_path / "diag" / "workers" / "0" / "status.json").is_file()
    assert said == [f"the profiler's native log (1 line) is in {log.path}; {NATIVE_LOG_HINT}"]

    # A run that ended well keeps everything, and the analysis named the log already.
    said.clear()
    done = Output(open_storage(tmp_path / "done"), created=tmp_path / "done")
    wrap_up_output(done, NativeLog(None), said.append, failed=False)
    assert said == []


def test_interrupt_is_no_error(cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import perfdiag.cli.analyze
    from perfdiag.local.errors import CliInterrupted

    def stopped(args: Any) -> int:
        raise CliInterrupted("interrupted; the training was stopped", 143)

    monkeypatch.setattr(perfdiag.cli.analyze, "main", stopped)
    code, _, err = cli("analyze", "somewhere")
    assert code == 143
    assert err == "perfdiag: interrupted; the training was stopped\n"


def test_wrote_line_names_every_file(tmp_path: Path) -> None:
    from perfdiag.analyzer.pipeline import _wrote_line

    storage = open_storage(tmp_path)
    assert _wrote_line(storage, breakdown=False) == (
        "wrote verdict.json, report.html and timeline.json.gz (open it in ui.perfetto.dev) "
        f"in {tmp_path}"
    )
    (tmp_path / "perfdiag-native.log").write_bytes(USDT_START + b"\n")
    line = _wrote_line(storage, breakdown=True)
    assert "breakdown.json and perfdiag-native.log (the profiler's own log lines)" in line


def test_the_log_is_named_once_after_a_run_that_ended_well(tmp_path: Path) -> None:
    said: list[str] = []
    output = open_output(str(tmp_path / "diag"), shared=False)
    log = NativeLog(tmp_path / "diag" / "perfdiag-native.log")
    log.write(USDT_START + b"\n")
    # No verdict next to it (captures in subfolders, another node's analysis): say where it is.
    wrap_up_output(output, log, said.append, failed=False)
    assert said == [f"the profiler's native log (1 line) is in {log.path}; {NATIVE_LOG_HINT}"]
    said.clear()
    output.storage.put_text("verdict.json", "{}")  # the analysis' "wrote …" line named the log
    wrap_up_output(output, log, said.append, failed=False)
    assert said == []
