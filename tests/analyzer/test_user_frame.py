"""The user's own frame behind a builtin or a library frame (analyzer/signals/user_frame.py)."""

from __future__ import annotations

import pyarrow as pa

from perfdiag.analyzer.signals.user_frame import excess_frames, is_user_frame, user_frame

MS = 1_000_000


def events(rows: list[tuple[str, int, int]], tid: int = 7) -> pa.Table:
    """(name, start ms, duration ms) Python frames on one host thread."""
    return pa.table(
        {
            "name": [r[0] for r in rows],
            "ts_ns": pa.array([r[1] * MS for r in rows], pa.int64()),
            "dur_ns": pa.array([r[2] * MS for r in rows], pa.int64()),
            "tid": pa.array([tid] * len(rows), pa.int64()),
            "device": pa.array([None] * len(rows), pa.int32()),
        }
    )


def test_user_frames_are_the_users_files_only() -> None:
    assert is_user_frame("train.py(60): tokenize")
    assert is_user_frame("src/model/blocks.py(12): forward")
    assert not is_user_frame("<built-in function sleep>")
    assert not is_user_frame("torch/utils/data/_utils/fetch.py(54): <listcomp>")
    assert not is_user_frame("typing.py(359): inner")
    assert not is_user_frame("<frozen abc>(117): __instancecheck__")


def test_a_builtin_is_named_by_the_user_function_that_calls_it() -> None:
    trace = events(
        [
            ("train.py(300): main", 0, 100),
            ("train.py(40): flush_metrics", 10, 22),
            ("<built-in function sleep>", 11, 20),
            ("train.py(40): flush_metrics", 50, 22),
            ("<built-in function sleep>", 51, 20),
        ]
    )
    assert user_frame(trace, "<built-in function sleep>") == "train.py(40): flush_metrics"


def test_a_library_frame_is_named_by_the_user_code_inside_it_that_holds_its_time() -> None:
    fetch = "torch/utils/data/_utils/fetch.py(54): <listcomp>"
    trace = events(
        [
            ("train.py(300): main", 0, 100),
            (fetch, 10, 30),
            ("train.py(90): __getitem__", 11, 13),
            ("train.py(99): decode_record", 12, 11),
            ("train.py(90): __getitem__", 25, 13),
            ("train.py(99): decode_record", 26, 11),
        ]
    )
    assert user_frame(trace, fetch) == "train.py(99): decode_record"
    # Waiting in a library function: its caller is only the training loop, which says nothing.
    waiting = events([("train.py(300): main", 0, 100), (fetch, 10, 30)])
    assert user_frame(waiting, fetch, enclosing=False) is None


def test_frames_of_another_thread_do_not_enclose() -> None:
    trace = pa.concat_tables(
        [
            events([("train.py(40): flush_metrics", 10, 22)], tid=8),
            events([("<built-in function sleep>", 11, 20)], tid=7),
        ]
    )
    assert user_frame(trace, "<built-in function sleep>") is None


def windowed(rows: list[tuple[str, int, int]]) -> pa.Table:
    table = events(rows)
    return table.append_column("step", pa.array([0] * table.num_rows, pa.int32()))


def test_the_frame_named_is_the_innermost_user_frame_holding_the_excess() -> None:
    # 2 steps; the culprit spends 20 ms/step in flush_metrics (in sleep), its peer none.
    culprit = windowed(
        [
            ("train.py(300): main", 0, 100),
            ("train.py(300): main", 100, 100),
            ("train.py(40): flush_metrics", 10, 20),
            ("<built-in function sleep>", 10, 20),
            ("train.py(40): flush_metrics", 110, 20),
            ("<built-in function sleep>", 110, 20),
            ("train.py(50): <listcomp>", 40, 1),
        ]
    )
    peer = windowed([("train.py(300): main", 0, 80), ("train.py(300): main", 100, 80)])
    path = excess_frames(culprit, 2, peer, 2, excess_ms=20.0, step_ms=100.0)
    assert path == ("train.py(40): flush_metrics",)  # not main (the loop), not the builtin
    # An excess no user frame holds names none.
    assert excess_frames(peer, 2, peer, 2, excess_ms=20.0, step_ms=100.0) == ()


def test_a_function_only_the_culprit_runs_is_named_before_a_shared_one_it_calls() -> None:
    # Every rank runs augment (5 ms/step); the culprit also calls it from extra_compute
    # (10 ms/step more). augment is innermost and holds the excess too, but it is mostly
    # what every rank does: extra_compute is what only this rank does.
    culprit = windowed(
        [
            ("train.py(300): main", 0, 100),
            ("train.py(300): main", 100, 100),
            ("train.py(20): augment", 10, 5),
            ("train.py(20): augment", 110, 5),
            ("train.py(30): extra_compute", 20, 10),
            ("train.py(20): augment", 20, 10),
            ("train.py(30): extra_compute", 120, 10),
            ("train.py(20): augment", 120, 10),
        ]
    )
    peer = windowed(
        [
            ("train.py(300): main", 0, 90),
            ("train.py(300): main", 100, 90),
            ("train.py(20): augment", 10, 5),
            ("train.py(20): augment", 110, 5),
        ]
    )
    path = excess_frames(culprit, 2, peer, 2, excess_ms=10.0, step_ms=100.0)
    # augment holds the excess too, but inside extra_compute: a callee, not a caller.
    assert path == ("train.py(30): extra_compute",)


def test_the_callers_holding_the_excess_are_said_before_the_frame_named() -> None:
    # The culprit's Dataset decodes with many more rounds of its tokenizer: named as
    # __getitem__ → decode → tokenize, so that a tokenizer other paths call too is told apart.
    culprit = windowed(
        [
            ("train.py(300): main", 0, 100),
            ("train.py(300): main", 100, 100),
            ("data.py(60): __getitem__", 10, 25),
            ("data.py(40): decode", 11, 22),
            ("train.py(10): tokenize", 12, 20),
            ("data.py(60): __getitem__", 110, 25),
            ("data.py(40): decode", 111, 22),
            ("train.py(10): tokenize", 112, 20),
            ("train.py(80): log", 50, 30),  # holds as much, but around none of them
            ("train.py(80): log", 150, 30),
        ]
    )
    peer = windowed(
        [
            ("train.py(300): main", 0, 80),
            ("train.py(300): main", 100, 80),
            ("data.py(60): __getitem__", 10, 5),
            ("data.py(40): decode", 11, 2),
            ("train.py(10): tokenize", 12, 1),
            ("data.py(60): __getitem__", 110, 5),
            ("data.py(40): decode", 111, 2),
            ("train.py(10): tokenize", 112, 1),
            ("train.py(80): log", 50, 10),
            ("train.py(80): log", 150, 10),
        ]
    )
    path = excess_frames(culprit, 2, peer, 2, excess_ms=20.0, step_ms=100.0)
    assert path == ("data.py(60): __getitem__", "data.py(40): decode", "train.py(10): tokenize")
