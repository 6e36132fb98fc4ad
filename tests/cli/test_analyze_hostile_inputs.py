"""Crafted or damaged inputs to `perfdiag analyze`: each gives a verdict (the bad file skipped,
and named with its reason in verdict.json) or a clear error naming the input, within bounded
time, memory and output, never a traceback or a raw escape sequence on the terminal."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from isal import isal_zlib

from perfdiag.analyzer import NoCaptureError, analyze
from perfdiag.api.limits import MAX_RANKS, MAX_TRACE_BYTES
from perfdiag.local.terminal import safe_json, safe_text
from perfdiag.storage import layout
from perfdiag.storage.local import LocalStorage
from tests.analyzer.conftest import SyntheticJob, write_capture
from tests.engine.test_kineto_malformed import _valid_trace

ESC = "\x1b"


def _trace(rank: int | None = 0, world: Any = 2, **changes: Any) -> dict[str, Any]:
    trace = _valid_trace()
    info: dict[str, Any] = {"world_size": world}
    if rank is not None:
        info["rank"] = rank
    trace["distributedInfo"] = info
    trace.update(changes)
    return trace


def _write(folder: Path, name: str, trace: dict[str, Any] | str) -> Path:
    path = folder / name
    path.write_text(trace if isinstance(trace, str) else json.dumps(trace))
    return path


def _verdict(folder: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((folder / layout.VERDICT).read_text())
    return document


def _notes(folder: Path) -> str:
    return "\n".join(_verdict(folder)["notes"])


# --- one crafted file is skipped, with its reason, not a traceback ----------------------------


def test_a_huge_profiler_step_number_skips_that_trace(cli: Any, tmp_path: Path) -> None:
    _write(tmp_path, "rank-0.json", _trace(0))
    bad = _trace(1)
    bad["traceEvents"][0]["name"] = "ProfilerStep#9223372036854775808"
    _write(tmp_path, "rank-1.json", bad)
    code, _, err = cli("analyze", str(tmp_path))
    assert code == 0, err
    assert "Traceback" not in err
    assert "rank-1.json: a ProfilerStep#N number is above the limit" in _notes(tmp_path)
    workers = {w["rank"]: w["state"] for w in _verdict(tmp_path)["workers"]}
    assert workers == {0: "ok", 1: "missing"}  # its name says rank 1: missing, and why


@pytest.mark.parametrize(
    ("name", "rank", "world"),
    [
        ("a.json", 2**31, 2),  # distributedInfo.rank
        ("rank-99999999999999999999.json", None, 2),  # the file name
        ("b.json", 1, 10**9),  # world size
        ("c.json", MAX_RANKS, 2),  # the first rank above the limit
    ],
)
def test_a_rank_or_world_size_above_the_limit_skips_that_trace(
    cli: Any, tmp_path: Path, name: str, rank: int | None, world: int
) -> None:
    _write(tmp_path, "rank-0.json", _trace(0))
    _write(tmp_path, name, _trace(rank, world))
    code, _, err = cli("analyze", str(tmp_path))
    assert code == 0, err
    assert f"limit of {MAX_RANKS:,} ranks" in err  # the progress line says it
    assert f"{name}: " in _notes(tmp_path) and "docs/limits.md" in _notes(tmp_path)
    assert len(_verdict(tmp_path)["workers"]) <= 2


@pytest.mark.parametrize("claim", ["world_size", "--expected-ranks"])
def test_a_world_size_at_the_limit_bounds_the_output(cli: Any, tmp_path: Path, claim: str) -> None:
    """Two captured ranks of a job claiming the most ranks allowed, by its traces' world size or
    by --expected-ranks: verdict.json, the report and the terminal follow the two ranks, and the
    other 99,998 are one range of verdict.json's `missing`."""
    world = MAX_RANKS if claim == "world_size" else 2
    options = ["--expected-ranks", str(MAX_RANKS)] if claim == "--expected-ranks" else []
    for rank in (0, 1):
        _write(tmp_path, f"rank-{rank}.json", _trace(rank, world))
    start = time.monotonic()
    code, out, err = cli("analyze", str(tmp_path), *options)
    assert code == 0, err
    assert time.monotonic() - start < 30
    assert len(out) < 10_000
    assert f"workers not captured: ranks 2-{MAX_RANKS - 1} missing" in out
    assert (tmp_path / layout.VERDICT).stat().st_size < 1_000_000
    assert (tmp_path / layout.REPORT).stat().st_size < 2_000_000
    verdict = _verdict(tmp_path)
    assert [(w["rank"], w["state"]) for w in verdict["workers"]] == [(0, "ok"), (1, "ok")]
    assert verdict["missing"] == [
        {"first": 2, "last": MAX_RANKS - 1, "reason": "no file in the capture"}
    ]
    assert f"2-{MAX_RANKS - 1}" in (tmp_path / layout.REPORT).read_text()
    code, out, err = cli("analyze", str(tmp_path), "--json", *options)
    assert code == 0, err
    assert len(out) < 10_000
    assert json.loads(out)["missing"] == verdict["missing"]


def test_scattered_missing_ranks_come_out_exact(cli: Any, tmp_path: Path) -> None:
    """Of a job of 8 ranks: 0, 1 and 3 captured, 4 left a file that cannot be read (a row of
    `workers`, missing with its reason), 2 and 5-7 left nothing (ranges of `missing`)."""
    for rank in (0, 1, 3):
        _write(tmp_path, f"rank-{rank}.json", _trace(rank, 8))
    _write(tmp_path, "rank-4.json", "{not json")
    code, out, err = cli("analyze", str(tmp_path))
    assert code == 0, err
    verdict = _verdict(tmp_path)
    assert [(w["rank"], w["state"]) for w in verdict["workers"]] == [
        (0, "ok"),
        (1, "ok"),
        (3, "ok"),
        (4, "missing"),
    ]
    assert [(m["first"], m["last"]) for m in verdict["missing"]] == [(2, 2), (5, 7)]
    assert "workers not captured: ranks 2,4-7 missing" in out
    assert verdict["status"] == "incomplete"
    assert verdict["summary"].startswith("Ranks 2,4-7 are missing")
    report = (tmp_path / layout.REPORT).read_text()
    assert '<td class="num">5-7</td>' in report and "no file in the capture" in report
    assert "rank-4.json: not valid JSON" in "\n".join(verdict["notes"])


def test_a_top_level_field_nested_5000_deep_skips_that_trace(cli: Any, tmp_path: Path) -> None:
    _write(tmp_path, "rank-0.json", _trace(0))
    deep = "[" * 5000 + "]" * 5000
    text = json.dumps(_trace(1))
    _write(tmp_path, "rank-1.json", text[:-1] + f', "deep": {deep}}}')
    args = _trace(2)
    args["traceEvents"][2]["args"]["Process Group Ranks"] = "@"
    _write(tmp_path, "rank-2.json", json.dumps(args).replace('"@"', deep))
    code, _, err = cli("analyze", str(tmp_path))
    assert code == 0, err
    notes = _notes(tmp_path)
    assert "rank-1.json: not valid JSON: nested too deeply" in notes
    assert "rank-2.json: not valid JSON: nested too deeply" in notes


def test_a_worker_folder_above_the_rank_limit_is_ignored_with_a_note(
    tmp_path: Path,
) -> None:
    local_storage = LocalStorage(tmp_path)
    table, metas = SyntheticJob(n_ranks=2, seed=3).build()
    write_capture(local_storage, table, metas)
    for name in ("9223372036854775808", str(2**31), "²"):
        local_storage.put_text(f"{layout.WORKERS}/{name}/{layout.STATUS}", "{}")
    verdict = analyze(local_storage)
    assert [w.rank for w in verdict.workers] == [0, 1]
    assert any("9223372036854775808/: rank" in n and "limit" in n for n in verdict.notes)


def test_a_world_size_above_the_limit_in_a_summary_makes_that_worker_unreadable(
    tmp_path: Path,
) -> None:
    local_storage = LocalStorage(tmp_path)
    table, metas = SyntheticJob(n_ranks=3, seed=3).build()
    metas[2] = metas[2].model_copy(update={"world_size": 10**9})
    write_capture(local_storage, table, metas)
    verdict = analyze(local_storage)
    assert {w.rank: w.state for w in verdict.workers} == {0: "ok", 1: "ok", 2: "missing"}
    assert any("rank 2 not analysed" in n and "world size 1000000000" in n for n in verdict.notes)


def test_expected_ranks_of_the_api_above_the_limit_are_ignored(
    tmp_path: Path,
) -> None:
    local_storage = LocalStorage(tmp_path)
    table, metas = SyntheticJob(n_ranks=2, seed=3).build()
    write_capture(local_storage, table, metas)
    verdict = analyze(local_storage, expected_ranks=[0, 1, 2, 10**12])
    assert [w.rank for w in verdict.workers] == [0, 1]
    assert [(m.first, m.last) for m in verdict.missing] == [(2, 2)]


# --- regular files only -------------------------------------------------------------------------


def test_a_fifo_or_a_link_to_a_device_is_refused_not_read(cli: Any, tmp_path: Path) -> None:
    _write(tmp_path, "rank-0.json", _trace(0))
    os.mkfifo(tmp_path / "rank-1.json")
    (tmp_path / "rank-2.json.gz").symlink_to("/dev/zero")
    start = time.monotonic()
    code, _, err = cli("analyze", str(tmp_path))
    assert code == 0, err
    assert time.monotonic() - start < 60
    notes = _notes(tmp_path)
    assert "rank-1.json: cannot read: a FIFO (named pipe), not a regular file" in notes
    assert "rank-2.json.gz: cannot read: a device (through a symbolic link)" in notes


def test_a_fifo_among_a_workers_files_is_refused(tmp_path: Path) -> None:
    local_storage = LocalStorage(tmp_path)
    table, metas = SyntheticJob(n_ranks=3, seed=3).build()
    write_capture(local_storage, table, metas)
    root = local_storage.root
    (root / layout.worker_key(1, layout.STATUS)).unlink()
    os.mkfifo(root / layout.worker_key(1, layout.STATUS))
    (root / layout.worker_key(2, layout.SUMMARY)).unlink()
    (root / layout.worker_key(2, layout.SUMMARY)).symlink_to("/dev/zero")
    verdict = analyze(local_storage)
    assert {w.rank: w.state for w in verdict.workers} == {0: "ok", 1: "ok", 2: "missing"}
    text = "\n".join(verdict.notes)
    assert "workers/1/status.json: cannot read" in text and "FIFO" in text
    assert "rank 2 not analysed" in text and "a device (through a symbolic link)" in text


# --- decompression bombs and huge strings: bounded time and memory -----------------------------

BOMB = 1 << 30  # bytes of text each bomb expands to (about 10 MB of gzip)
_EVENT = b'{"ph": "X", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 1}'


def _gzip_bomb(path: Path, head: bytes, fill: bytes, tail: bytes) -> None:
    """`head`, BOMB bytes of `fill`, `tail`, gzipped as a stream (ISA-L's fastest level writes
    it in a fraction of a second)."""
    chunk = fill * (1 << 20)
    stream = isal_zlib.compressobj(0, isal_zlib.DEFLATED, 31)
    with path.open("wb") as fh:
        fh.write(stream.compress(head))
        for _ in range(BOMB // len(chunk)):
            fh.write(stream.compress(chunk))
        fh.write(stream.compress(tail))
        fh.write(stream.flush())


# Runs a command and reports (exit code, seconds, peak RSS in KiB) of it alone: this process
# has no other child.
_MEASURE = """
import resource, subprocess, sys, time
start = time.monotonic()
done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
seconds = time.monotonic() - start
print(done.returncode, seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.stderr.write(done.stderr)
"""


def _analyze_measured(folder: Path, out: Path) -> tuple[int, float, float, str]:
    """`perfdiag analyze FOLDER --out OUT` as a user runs it, in a fresh process: (exit code,
    seconds, peak RSS in MB, stderr)."""
    script = Path(sys.executable).with_name("perfdiag")  # the console script, as installed
    perfdiag = (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "from perfdiag.cli import entry; entry()"]
    )
    command = [sys.executable, "-c", _MEASURE, *perfdiag, "analyze", str(folder)]
    done = subprocess.run(
        [*command, "--out", str(out)], capture_output=True, text=True, timeout=300
    )
    code, seconds, rss_kib = done.stdout.split()
    return int(code), float(seconds), int(rss_kib) / 1024, done.stderr


BOMBS: dict[str, tuple[bytes, bytes, bytes, str | None]] = {
    # (text before, the byte repeated, text after, the reason in the notes; None: read)
    "zeros": (b"", b"\0", b"", "not valid JSON: Expecting value (line 1, column 1, byte 0)"),
    "spaces": (
        b"",
        b" ",
        b"",
        f"not valid JSON: the file ends early (line 1, column {BOMB + 1:d}, byte {BOMB:d})",
    ),
    "zeros after the top-level brace": (
        b"{",
        b"\0",
        b"",
        "not valid JSON: Expecting property name enclosed in double quotes "
        "(line 1, column 2, byte 1)",
    ),
    "one huge string": (
        b'{"traceEvents": [{"ph": "X", "name": "',
        b"a",
        b'"}]}',
        "the JSON string at byte 37 is longer than 16 MiB, the limit for one string",
    ),
    "newlines before a trace": (b"", b"\n", json.dumps(_trace(1)).encode(), None),
    "blanks between two events": (
        b'{"distributedInfo": {"rank": 1}, "traceEvents": [' + _EVENT + b",",
        b"\t",
        _EVENT + b"]}",
        None,
    ),
    "blanks inside an event": (
        b'{"distributedInfo": {"rank": 1}, "traceEvents": [{"ph": "X",',
        b"\r",
        _EVENT[1:] + b"]}",
        None,
    ),
}


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_a_gzip_bomb_is_answered_in_bounded_time_and_memory(bomb: str, tmp_path: Path) -> None:
    head, fill, tail, reason = BOMBS[bomb]
    traces = tmp_path / "traces"
    traces.mkdir()
    _write(traces, "rank-0.json", _trace(0))
    _gzip_bomb(traces / "rank-1.json.gz", head, fill, tail)
    assert (traces / "rank-1.json.gz").stat().st_size < 15_000_000
    code, seconds, rss_mb, err = _analyze_measured(traces, tmp_path / "out")
    assert code == 0, err
    assert "Traceback" not in err
    assert seconds < 20, seconds
    assert rss_mb < 600, rss_mb
    workers = {w["rank"]: w["state"] for w in _verdict(tmp_path / "out")["workers"]}
    if reason is None:  # a valid trace, padded: read
        assert workers == {0: "ok", 1: "ok"}, _notes(tmp_path / "out")
    else:
        assert f"rank-1.json.gz: {reason}" in _notes(tmp_path / "out")
        assert workers == {0: "ok", 1: "missing"}


def test_a_trace_file_above_the_size_limit_is_refused_unread(cli: Any, tmp_path: Path) -> None:
    _write(tmp_path, "rank-0.json", _trace(0))
    with (tmp_path / "rank-1.json").open("wb") as fh:
        fh.truncate(MAX_TRACE_BYTES + 1)  # sparse: takes no disk and no time
    start = time.monotonic()
    code, _, err = cli("analyze", str(tmp_path))
    assert code == 0, err
    assert time.monotonic() - start < 60
    assert (
        "rank-1.json: holds more than 4 GiB of JSON text, the limit for one trace file "
        "(docs/limits.md)" in _notes(tmp_path)
    )


# --- an empty capture holds no capture ----------------------------------------------------------


def test_a_capture_folder_with_only_its_plan_exits_5(cli: Any, tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    table, metas = SyntheticJob(n_ranks=1).build()
    write_capture(storage, table, metas)
    for rank in metas:
        for name in (layout.SUMMARY, layout.STATUS):
            storage.delete(layout.worker_key(rank, name))
    (tmp_path / layout.WORKERS / "0").rmdir()
    assert sorted(p.name for p in tmp_path.iterdir()) == [layout.PLAN, layout.WORKERS]
    code, out, err = cli("analyze", str(tmp_path))
    assert code == 5
    assert "holds no capture" in err and "plan.json is there but no worker wrote" in err
    assert out == ""
    with pytest.raises(NoCaptureError):
        analyze(storage)


# --- nothing from the input reaches a terminal raw ----------------------------------------------

EVIL = "\x1b]0;pwned\x07\x1b[2J\x1b[31mFAKE\x9b31m\u202e"


def test_escape_sequences_in_trace_names_are_not_printed(cli: Any, tmp_path: Path) -> None:
    slow = _trace(1)
    slow["traceEvents"][1]["name"] = f"train.py(1): {EVIL}"
    slow["traceEvents"][1]["cat"] = "python_function"
    slow["traceEvents"][1]["dur"] = 45  # most of the step: the top finding names it
    _write(tmp_path, "rank-0.json", _trace(0))
    _write(tmp_path, "rank-1.json", slow)
    _write(tmp_path, f"rank-2{EVIL}.json", "{garbage")
    code, out, err = cli("analyze", str(tmp_path))
    assert code == 0, err
    for text in (out, err):
        assert ESC not in text and "\x07" not in text and "\x9b" not in text
        assert "\u202e" not in text
    assert "\\x1b" in err  # the bad file's name, escaped
    code, out, _ = cli("analyze", str(tmp_path), "--json")
    assert code == 0 and ESC not in out and "\x9b" not in out
    assert json.loads(out) == _verdict(tmp_path)  # the same document, escaped


def test_error_messages_are_sanitised(cli: Any, tmp_path: Path) -> None:
    code, _, err = cli("analyze", str(tmp_path / f"no{EVIL}"))
    assert code == 1 and ESC not in err and "\\x1b" in err


def test_safe_text_keeps_newlines_and_tabs_and_escapes_the_rest() -> None:
    assert safe_text("a\n\tb") == "a\n\tb"
    assert safe_text("\x1b[31m\x00\x7f\x85\u202e") == "\\x1b[31m\\x00\\x7f\\x85\\u202e"
    document = json.dumps({"k": "\x9b\u2066"}, ensure_ascii=False)
    assert json.loads(safe_json(document)) == {"k": "\x9b\u2066"}
    assert "\x9b" not in safe_json(document)


# --- unusable inputs are recorded in verdict.json -----------------------------------------------


def test_garbage_status_plan_trigger_and_events_are_recorded_in_the_notes(
    tmp_path: Path,
) -> None:
    local_storage = LocalStorage(tmp_path)
    table, metas = SyntheticJob(n_ranks=3, seed=5).build()
    write_capture(local_storage, table, metas)
    local_storage.put_bytes(layout.worker_key(1, layout.STATUS), b"\xff{not json")
    local_storage.put_text(layout.worker_key(2, layout.STACKS), "[" * 5000)
    local_storage.put_text(layout.worker_key(0, layout.EVENTS), "PAR1 truncated")
    local_storage.put_text(layout.PLAN, '{"id": 3}')
    local_storage.put_text(layout.TRIGGER, "garbage")
    verdict = analyze(local_storage)
    text = "\n".join(verdict.notes)
    assert "status of rank 1" in text and "not readable JSON" in text
    assert "workers/2/stacks.json: not readable JSON" in text
    assert "plan.json" in text and "trigger.json" in text
    assert "workers/0/events.parquet" in text
    assert verdict.status == "healthy" or verdict.findings  # the capture still analysed


def test_an_unreadable_summary_is_in_the_notes(tmp_path: Path) -> None:
    local_storage = LocalStorage(tmp_path)
    table, metas = SyntheticJob(n_ranks=3, seed=5).build()
    write_capture(local_storage, table, metas)
    data = local_storage.get_bytes(layout.worker_key(1, layout.SUMMARY))
    local_storage.put_bytes(layout.worker_key(1, layout.SUMMARY), data[: len(data) // 2])
    verdict = analyze(local_storage)
    assert verdict.status == "incomplete"
    assert any(n.startswith("rank 1 not analysed: ") for n in verdict.notes)


# --- small ones ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["-3", "0", "1000000000", "x"])
def test_expected_ranks_must_be_a_number_of_ranks(cli: Any, tmp_path: Path, value: str) -> None:
    code, _, err = cli("analyze", str(tmp_path), "--expected-ranks", value)
    assert code == 2
    assert "--expected-ranks" in err


def test_workers_not_captured_are_listed_as_ranges(cli: Any, tmp_path: Path) -> None:
    _write(tmp_path, "rank-0.json", _trace(0, 128))
    _write(tmp_path, "rank-5.json", _trace(5, 128))
    code, out, err = cli("analyze", str(tmp_path))
    assert code == 0, err
    assert "workers not captured: ranks 1-4,6-127 missing" in out


_SLOW_ANALYZE = """
import sys, time
import perfdiag.engine.kineto as kineto
real = kineto.read_kineto
def slow(path, **kw):
    print("started", flush=True)
    time.sleep(2)
    return real(path, **kw)
kineto.read_kineto = slow
from perfdiag.cli import main
sys.exit(main(["analyze", sys.argv[1], "--quiet"]))
"""


def test_sigterm_during_analyze_removes_its_temporary_folder(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    _write(traces, "rank-0.json", _trace(0))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_ANALYZE, str(traces)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    started = proc.stdout.readline().strip()
    assert started == "started", proc.communicate(timeout=60)
    assert [p.name for p in tmp.iterdir() if p.name.startswith("perfdiag-kineto-")]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "terminated" in err
    assert not list(tmp.iterdir())


# --- property-based: any structured input gives a verdict or a clear error ----------------------

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
NUMBERS = (
    st.integers(-(2**70), 2**70)
    | st.sampled_from([0, 1, 2, MAX_RANKS - 1, MAX_RANKS, 2**31, 2**63, 10**9])
    | st.floats(allow_nan=False)
    | st.none()
    | st.text(max_size=4)
    | st.booleans()
)
NAMES = st.sampled_from(["aten::mm", "gloo:all_reduce", "train.py(3): f", EVIL]) | st.text(
    max_size=12
)
STEP_NAMES = st.builds(
    lambda n: f"ProfilerStep#{n}",
    st.integers(0, 2**70) | st.sampled_from([2**62, 2**63, 2**64]),
)


def _assert_bounded_outcome(cli: Any, folder: Path, input_bytes: int) -> None:
    start = time.monotonic()
    code, out, err = cli("analyze", str(folder))
    assert time.monotonic() - start < 60
    assert code in (0, 1, 5), err
    assert "Traceback" not in err
    for text in (out, err):
        assert ESC not in text and "\x9b" not in text
    if code == 0:
        # The report and the terminal output scale with the input, not a claimed world size.
        assert len(out) < 20_000
        assert (folder / layout.REPORT).stat().st_size < 2_000_000 + 100 * input_bytes
        verdict = _verdict(folder)
        assert len(verdict["workers"]) <= MAX_RANKS + 4
    else:
        assert str(folder) in err or "--" in err  # the error names the input


@SETTINGS
@given(
    files=st.lists(
        st.fixed_dictionaries(
            {
                "name": st.sampled_from(["rank-0.json", "rank-1.json.gz", "rank-2.json", "x.json"])
                | st.builds(lambda n: f"rank-{n}.json", st.integers(0, 2**70)),
                "info": st.dictionaries(st.sampled_from(["rank", "world_size"]), NUMBERS),
                "step": STEP_NAMES | NAMES,
                "op": NAMES,
                "header": st.dictionaries(
                    st.sampled_from(["trace_id", "baseTimeNanoseconds", "host_name", "deep"]),
                    NUMBERS | st.integers(0, 3000).map(lambda d: [[]] * 0 or "[" * d + "]" * d),
                ),
            }
        ),
        min_size=1,
        max_size=4,
        unique_by=lambda f: f["name"],
    )
)
def test_any_kineto_folder_gives_a_verdict_or_a_clear_error(
    cli: Any, tmp_path_factory: pytest.TempPathFactory, files: list[dict[str, Any]]
) -> None:
    folder = tmp_path_factory.mktemp("kineto")
    size = 0
    for spec in files:
        trace = _valid_trace()
        trace["distributedInfo"] = spec["info"]
        trace["traceEvents"][0]["name"] = spec["step"]
        trace["traceEvents"][1]["name"] = spec["op"]
        raw = {k: v for k, v in spec["header"].items() if not isinstance(v, str) or "[" not in v}
        trace.update(raw)
        text = json.dumps(trace)
        deep = [v for v in spec["header"].values() if isinstance(v, str) and v.startswith("[")]
        if deep:
            text = text[:-1] + f', "deep": {deep[0]}}}'
        data = text.encode()
        if spec["name"].endswith(".gz"):
            data = gzip.compress(data)
        (folder / spec["name"]).write_bytes(data)
        size += len(data)
    _assert_bounded_outcome(cli, folder, size)


@SETTINGS
@given(
    damage=st.lists(
        st.tuples(
            st.integers(0, 3),
            st.sampled_from(
                [layout.SUMMARY, layout.STATUS, layout.STACKS, layout.EVENTS, "flight_recorder.pkl"]
            ),
            st.sampled_from(["truncate", "garbage", "deep", "empty", "fifo"]),
        ),
        max_size=4,
    ),
    plan=st.sampled_from(["keep", "garbage", "remove"]),
    world=st.sampled_from([None, 4, 100, MAX_RANKS, MAX_RANKS + 1, 2**40]),
    extra_rank=st.sampled_from([None, "7", "99999999999", "²", "-1"]),
)
def test_any_damaged_capture_gives_a_verdict_or_a_clear_error(
    cli: Any,
    tmp_path_factory: pytest.TempPathFactory,
    damage: list[tuple[int, str, str]],
    plan: str,
    world: int | None,
    extra_rank: str | None,
) -> None:
    folder = tmp_path_factory.mktemp("capture")
    storage = LocalStorage(folder)
    table, metas = SyntheticJob(n_ranks=4, seed=1).build()
    metas = {r: m.model_copy(update={"world_size": world}) for r, m in metas.items()}
    write_capture(storage, table, metas)
    for rank, name, how in damage:
        path = folder / layout.worker_key(rank, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = path.read_bytes() if path.is_file() else b'{"rank": 0}'
        path.unlink(missing_ok=True)
        if how == "fifo":
            os.mkfifo(path)
            continue
        path.write_bytes(
            {
                "truncate": data[: len(data) // 2],
                "garbage": b"\xff\x00garbage\x1b[2J",
                "deep": b"[" * 5000,
                "empty": b"",
            }[how]
        )
    if plan == "garbage":
        storage.put_text(layout.PLAN, "{[")
    elif plan == "remove":
        storage.delete(layout.PLAN)
    if extra_rank is not None:
        storage.put_text(f"{layout.WORKERS}/{extra_rank}/{layout.STATUS}", "{}")
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    _assert_bounded_outcome(cli, folder, size)


def test_the_report_lists_at_most_its_rows_of_missing_ranks(cli: Any, tmp_path: Path) -> None:
    """Every other rank of 500 captured: 210 runs of missing ranks; the report lists the first
    200 and names the rest as ranges, with their count."""
    for rank in range(0, 420, 2):
        _write(tmp_path, f"rank-{rank}.json", _trace(rank, 500))
    code, out, err = cli("analyze", str(tmp_path), "--quiet")
    assert code == 0, err
    verdict = _verdict(tmp_path)
    assert len(verdict["workers"]) == 210
    missing = [(m["first"], m["last"]) for m in verdict["missing"]]
    assert missing == [*((r, r) for r in range(1, 419, 2)), (419, 499)]
    assert "workers not captured: ranks 1,3,5,7,9,11,13,15,17,19,21,23,… (290 ranks) missing" in out
    report = (tmp_path / layout.REPORT).read_text()
    assert report.count('<td class="state-missing">missing</td>') == 200
    assert (
        "90 more missing or stuck workers not listed "
        "(ranks 401,403,405,407,409,411,413,415,417,419-499)"
    ) in report
    assert "210 more healthy workers not listed" in report
