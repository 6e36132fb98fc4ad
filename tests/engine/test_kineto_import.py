"""Import of real Kineto traces (the shared HTA test traces, written by torch.profiler on GPUs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from perfdiag.api.schema import EVENTS_SCHEMA, EVENTS_SCHEMA_ID, read_meta
from perfdiag.engine.kineto import fast_reader, load_trace, read_kineto

# (folder/file part, rank, first step, steps, has_gpu)
EXPECTED = {
    "cpu_only": (34, 551, 1, False),
    "alexnet": (0, 0, 1, True),
    "nccl_data": (0, 4, 3, True),
    "ns_resolution_trace": (0, 101, 5, True),
    "control": (3, 1009, 6, True),
    "test.json": (1, 1009, 6, True),
    "sampled_rank-0": (0, 551, 2, True),
    "sampled_rank-1": (1, 551, 2, True),
}


def _expected(path: Path) -> tuple[int, int, int, bool]:
    matches = [value for key, value in EXPECTED.items() if key in str(path)]
    assert len(matches) == 1, path
    return matches[0]


def test_every_shared_trace_is_known(hta_files: list[Path]) -> None:
    assert len(hta_files) == len(EXPECTED)
    for path in hta_files:
        _expected(path)


def test_every_trace_imports_with_its_window_and_rank(hta_files: list[Path]) -> None:
    for path in hta_files:
        events, meta = read_kineto(path)
        rank, start, steps, has_gpu = _expected(path)
        assert (meta.rank, meta.window.start_step, meta.window.steps) == (rank, start, steps), path
        assert meta.has_gpu is has_gpu and meta.source == "kineto"
        assert events.schema.equals(EVENTS_SCHEMA, check_metadata=False)
        assert read_meta(events.schema, EVENTS_SCHEMA_ID) == meta
        bounds = meta.window.step_bounds_ns
        assert all(s < e for s, e in bounds)
        assert all(bounds[i][1] <= bounds[i + 1][0] for i in range(len(bounds) - 1))
        ts = events["ts_ns"].to_numpy()
        end = ts + events["dur_ns"].to_numpy()
        assert (events["dur_ns"].to_numpy() >= 0).all()
        # Every event overlaps the window; its step is the one containing its start.
        assert (end >= bounds[0][0]).all() and (ts < bounds[-1][1]).all()
        step = events["step"].to_numpy()
        inside = (ts >= bounds[0][0]) & (ts < bounds[-1][1])
        assert (step[~inside] == -1).all()
        for index, (s, e) in enumerate(bounds):
            assert ((step == index) == ((ts >= s) & (ts < e))).all()
        assert set(pc.unique(events["rank"]).to_pylist()) == {rank}


def test_fast_and_general_readers_agree_on_real_traces(hta_files: list[Path]) -> None:
    for path in hta_files:
        raw = load_trace(path)
        assert raw.fast, f"{path}: the fast reader fell back to the general one"
        general = load_trace(path, fast=False)
        assert not general.fast
        assert raw.events.equals(general.events), path
        assert raw.header == general.header


def test_small_pieces_give_the_same_events_on_real_traces(
    hta_files: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    for path in hta_files:
        whole = load_trace(path)
        pieces = load_trace(path, piece=1 << 16)
        assert pieces.fast and pieces.events.equals(whole.events), path
        assert pieces.header == whole.header
    # Chunks closed after every piece (at 1 GiB of text otherwise): the same events.
    monkeypatch.setattr(fast_reader, "CHUNK_TEXT", 1)
    chunks = []
    for path in hta_files:
        chunked = load_trace(path, piece=1 << 18)
        chunks.append(chunked.events["name"].num_chunks)
        assert chunked.fast and chunked.events.equals(load_trace(path, fast=False).events), path
    assert max(chunks) > 10, chunks


def test_nanosecond_timestamps_are_kept(hta_files: list[Path]) -> None:
    path = next(p for p in hta_files if "ns_resolution" in str(p))
    events, _ = read_kineto(path)
    ts = events["ts_ns"].to_numpy()
    # 1712195495519689.047 µs in the file: float64 could not keep the last digits.
    assert 1712195495519689047 in set(ts.tolist())
    assert (ts % 1000 != 0).mean() > 0.9


def test_base_time_is_added_to_relative_timestamps(hta_files: list[Path]) -> None:
    path = next(p for p in hta_files if "nccl_data" in str(p))
    raw = load_trace(path)
    assert raw.base_ns == 1711964646000000000
    # 4458676522690.655 µs after the base: the first event of the file.
    assert int(raw.events["ts_ns"][0].as_py()) == 1711964646000000000 + 4458676522690655


def test_nccl_collectives_carry_their_parameters(hta_files: list[Path]) -> None:
    path = next(p for p in hta_files if "nccl_data" in str(p))
    events, _ = read_kineto(path)
    kernels = events.filter(pc.starts_with(events["name"], "ncclKernel_AllReduce"))
    assert kernels.num_rows > 0
    assert set(kernels["category"].to_pylist()) == {"communication"}
    assert set(kernels["collective"].to_pylist()) == {"allreduce"}
    first = kernels.sort_by("ts_ns").slice(0, 1).to_pylist()[0]
    assert first["group_size"] == 2 and first["pg_name"] == "0" and first["pg_ranks"] == "[0, 1]"
    assert first["dtype"] == "Float" and first["msg_bytes"] % 4 == 0 and first["msg_bytes"] > 0
    assert first["device"] == 0 and first["stream"] == 40
    record = events.filter(pc.equal(events["name"], "record_param_comms")).sort_by("ts_ns")
    for group in set(record["pg_name"].to_pylist()):
        mine = record.filter(
            pc.is_null(record["pg_name"]) if group is None else pc.equal(record["pg_name"], group)
        )
        assert mine["seq"].to_pylist() == list(range(mine.num_rows))  # issue order per group
    sizes = record.filter(pc.equal(record["collective"], "allreduce"))["msg_bytes"].to_pylist()
    assert 8196000 in sizes  # In msg nelems 2049000 × 4 bytes (Float)
    allreduce = record.filter(pc.equal(record["collective"], "allreduce"))
    # An all-reduce's output is as large as its input.
    assert allreduce["out_msg_bytes"].to_pylist() == allreduce["msg_bytes"].to_pylist()
    other = events.filter(pc.not_equal(events["category"], "communication"))
    assert other["out_msg_bytes"].null_count == other.num_rows
    annotations = events.filter(pc.equal(events["name"], "nccl:all_reduce"))
    host_side = annotations.filter(pc.is_null(annotations["device"]))
    assert host_side.num_rows and set(host_side["category"].to_pylist()) == {"communication"}
    # The GPU-side range only frames the NCCL kernel (a container).
    gpu_side = annotations.filter(pc.is_valid(annotations["device"]))
    assert gpu_side.num_rows and set(gpu_side["kineto_cat"].to_pylist()) == {"gpu_user_annotation"}
    assert set(gpu_side["category"].to_pylist()) == {"annotation"}


def test_gloo_annotations_get_their_message_size(hta_files: list[Path]) -> None:
    path = next(p for p in hta_files if "cpu_only" in str(p))
    events, meta = read_kineto(path)
    gloo = events.filter(pc.equal(events["name"], "gloo:all_reduce"))
    assert gloo.num_rows >= 1
    assert set(gloo["collective"].to_pylist()) == {"allreduce"}
    assert set(gloo["msg_bytes"].to_pylist()) <= {321271 * 4, 2082411 * 4}
    assert meta.world_size == 300


def test_device_events_have_device_and_stream(hta_files: list[Path]) -> None:
    path = next(p for p in hta_files if "alexnet" in str(p))
    events, _ = read_kineto(path)
    device = events.filter(pc.is_valid(events["device"]))
    assert set(device["kineto_cat"].to_pylist()) >= {"kernel", "gpu_memcpy", "cuda_sync"}
    assert device["stream"].null_count == 0
    kernels = device.filter(pc.equal(device["kineto_cat"], "kernel"))
    assert (kernels["stream"].to_numpy() == kernels["tid"].to_numpy()).all()
    host = events.filter(pc.is_null(events["device"]))
    assert set(host["kineto_cat"].to_pylist()) == {"cpu_op", "cuda_runtime", "user_annotation"}
    assert host["stream"].null_count == host.num_rows


def test_window_without_profiler_steps_is_the_whole_trace(hta_files: list[Path]) -> None:
    path = next(p for p in hta_files if "alexnet" in str(p))
    events, meta = read_kineto(path)
    ((start, end),) = meta.window.step_bounds_ns
    assert start == pc.min(events["ts_ns"]).as_py()
    assert end == pc.max(pc.add(events["ts_ns"], events["dur_ns"])).as_py()
    assert (events["step"].to_numpy() == 0).all()


@pytest.mark.parametrize("explicit", [7, None])
def test_explicit_rank_wins(hta_files: list[Path], explicit: int | None) -> None:
    path = next(p for p in hta_files if "sampled_rank-1" in str(p))
    _, meta = read_kineto(path, rank=explicit)
    assert meta.rank == (explicit if explicit is not None else 1)


def test_profiler_step_ranges_are_contiguous_steps(hta_files: list[Path]) -> None:
    path = next(p for p in hta_files if "control" in str(p))
    events, meta = read_kineto(path)
    steps = events.filter(pc.match_substring_regex(events["name"], r"^ProfilerStep#\d+$")).sort_by(
        "ts_ns"
    )
    starts = steps["ts_ns"].to_numpy()
    bounds = np.array(meta.window.step_bounds_ns)
    assert (bounds[:, 0] == starts).all()
    assert (bounds[:-1, 1] == starts[1:]).all()


def test_label_pids_far_from_the_end_keep_the_fast_reader(tmp_path: Path) -> None:
    # Kineto writes its label pids ("Spans") among the last events; elsewhere, the fast reader
    # must still cope (rename them all) rather than fall back to the slow one.
    label = {
        "ph": "X",
        "cat": "Trace",
        "name": "PyTorch Profiler (0)",
        "pid": "Spans",
        "tid": "PyTorch Profiler",
        "ts": 0,
        "dur": 10,
    }
    events = [label] + [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": f"aten::op{i % 7}",
            "pid": 3,
            "tid": 3,
            "ts": 1 + i,
            "dur": 1,
            "args": {"External id": i, "Input Dims": [[i, 3]]},
        }
        for i in range(3000)
    ]
    import json as json_module

    path = tmp_path / "rank-0.json"
    path.write_text(json_module.dumps({"traceEvents": events}, indent=2))
    assert path.stat().st_size > 4 * 65536
    raw = load_trace(path)
    assert raw.fast
    assert raw.events.equals(load_trace(path, fast=False).events)
    assert raw.events.num_rows == 3001
    assert raw.events["pid"].null_count == 1


def test_an_old_trace_names_its_process_group_by_id(hta_files: list[Path]) -> None:
    path = next(p for p in hta_files if "ns_resolution" in str(p))
    events, _ = read_kineto(path)
    record = events.filter(pc.equal(events["name"], "record_param_comms"))
    assert record.num_rows > 0
    # "Process Group ID": 0 and no "Process Group Name" in this torch's args.
    assert set(record["pg_name"].to_pylist()) == {"0"}
    assert set(record["collective"].to_pylist()) >= {"allreduce"}


def test_the_process_groups_own_sequence_number_wins(tmp_path: Path) -> None:
    import json as json_module

    def call(ts: int, seq: int | None) -> dict[str, object]:
        args: dict[str, object] = {"Collective name": "allreduce", "Process Group Name": "0"}
        if seq is not None:
            args["Seq"] = seq
        return {
            "ph": "X",
            "cat": "cpu_op",
            "name": "record_param_comms",
            "pid": 1,
            "tid": 1,
            "ts": ts,
            "dur": 1,
            "args": args,
        }

    events = [call(10, 41), call(20, 42), call(30, None)]
    path = tmp_path / "rank-0.json"
    path.write_text(json_module.dumps({"traceEvents": events}))
    table, _ = read_kineto(path)
    # Seq where Kineto wrote it; the issue order where it did not.
    assert table.sort_by("ts_ns")["seq"].to_pylist() == [41, 42, 2]
