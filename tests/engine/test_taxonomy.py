"""The taxonomy on real traces and on the names CPU jobs show."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfdiag.api import taxonomy
from perfdiag.api.schema import CATEGORIES
from perfdiag.engine.kineto import load_trace, read_kineto

# Kineto category → the taxonomy categories its events may get.
ALLOWED = {
    "kernel": {"gpu_compute", "communication"},
    "gpu_memcpy": {"gpu_memory"},
    "gpu_memset": {"gpu_memory"},
    "cuda_runtime": {"cuda_runtime"},
    "cuda_driver": {"cuda_runtime"},
    "cuda_sync": {"cuda_runtime"},
    "cpu_op": {"cpu_op", "communication", "dataloader"},
    "user_annotation": {"annotation", "communication", "dataloader"},
    "gpu_user_annotation": {"annotation"},
    "python_function": {"python", "dataloader", "communication"},
}


def test_every_kineto_category_of_the_real_traces_is_mapped(hta_files: list[Path]) -> None:
    seen: set[str] = set()
    for path in hta_files:
        raw = load_trace(path)
        seen |= {c.lower() for c in raw.events["cat"].to_pylist() if c}
        events, _ = read_kineto(path)
        for kineto_cat, category in zip(
            events["kineto_cat"].to_pylist(), events["category"].to_pylist(), strict=True
        ):
            assert category in ALLOWED[kineto_cat], (path, kineto_cat, category)
            assert category in CATEGORIES
    assert seen <= set(taxonomy.KINETO_CATEGORIES), seen - set(taxonomy.KINETO_CATEGORIES)
    assert {
        "kernel",
        "gpu_memcpy",
        "gpu_memset",
        "cuda_runtime",
        "cuda_sync",
        "cpu_op",
        "user_annotation",
        "gpu_user_annotation",
    } <= seen


def test_kernels_split_into_compute_and_nccl(hta_files: list[Path]) -> None:
    path = next(p for p in hta_files if "control" in str(p))
    events, _ = read_kineto(path)
    kernels = events.filter(pc.equal(events["kineto_cat"], "kernel"))
    nccl = pc.match_substring_regex(kernels["name"], r"^nccl(Dev)?Kernel")
    categories = np.array(kernels["category"].to_pylist())
    assert (categories[np.asarray(nccl)] == "communication").all()
    assert (categories[~np.asarray(nccl)] == "gpu_compute").all()
    assert np.asarray(nccl).any() and (~np.asarray(nccl)).any()


def _categorize(pairs: list[tuple[str, str]]) -> list[str]:
    cats = pa.array([c for c, _ in pairs])
    names = pa.array([n for _, n in pairs])
    return taxonomy.categorize(cats, names).to_pylist()


def test_cpu_job_names() -> None:
    pairs = [
        ("user_annotation", "gloo:all_reduce"),
        ("cpu_op", "c10d::allreduce_"),
        ("cpu_op", "record_param_comms"),
        ("cpu_op", "_c10d_functional::wait_tensor"),
        ("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"),
        ("python_function", "torch/utils/data/dataloader.py(1280): _try_get_data"),
        ("python_function", "train.py(20): main"),
        (
            "python_function",
            "<built-in method wait of torch._C._distributed_c10d.Work object at 0x7f0>",
        ),
        ("user_annotation", "ProfilerStep#12"),
        ("user_annotation", "Optimizer.step#SGD.step"),
        ("user_annotation", "DistributedDataParallel.forward"),
        ("cpu_op", "aten::addmm"),
        ("cpu_op", "torch.distributed.ddp.reducer::copy_bucket_to_grad"),
        ("gc", "gc.collect(gen=2)"),
        ("cuda_driver", "cuLaunchKernel"),
        ("overhead", "Activity Buffer Request"),
        (None, "unnamed"),  # type: ignore[list-item]
    ]
    assert _categorize(pairs) == [
        "communication",
        "communication",
        "communication",
        "communication",
        "dataloader",
        "dataloader",
        "python",
        "communication",
        "annotation",
        "annotation",
        "annotation",
        "cpu_op",
        "cpu_op",
        "gc",
        "cuda_runtime",
        "other",
        "other",
    ]


def test_containers() -> None:
    cats = pa.array(
        [
            "user_annotation",
            "user_annotation",
            "user_annotation",
            "gpu_user_annotation",
            "Trace",
            "cpu_op",
            "user_annotation",
        ]
    )
    names = pa.array(
        [
            "ProfilerStep#3",
            "Optimizer.step#Adam.step",
            "Optimizer.zero_grad#Adam.zero_grad",
            "nccl:all_reduce",
            "PyTorch Profiler (0)",
            "aten::mm",
            "## forward ##",
        ]
    )
    assert taxonomy.is_container(cats, names).tolist() == [
        True,
        True,
        True,
        True,
        True,
        False,
        False,
    ]


def test_charge_classes_put_gpu_first_and_host_waits_last() -> None:
    category = pa.array(
        ["gpu_compute", "gpu_memory", "communication", "cpu_op", "communication", "python"]
    )
    on_device = np.array([True, True, True, False, False, False])
    classes = taxonomy.charge_class(category, on_device).tolist()
    assert classes == sorted(classes, reverse=True) and len(set(classes)) == 6


def test_function_names_are_the_same_on_every_rank() -> None:
    names = pa.array(
        [
            "<built-in method __enter__ of _thread.lock object at 0x7f062038b5c0>",
            "<built-in method __enter__ of _thread.lock object at 0x7f99aa00b000>",
            "ProfilerStep#41",
            "gen.py(16): main",
        ]
    )
    assert taxonomy.function_names(names).to_pylist() == [
        "<built-in method __enter__ of _thread.lock object>",
        "<built-in method __enter__ of _thread.lock object>",
        "ProfilerStep#*",
        "gen.py(16): main",
    ]


def test_collective_names_one_spelling() -> None:
    names = pa.array(
        [
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)",
            "gloo:all_reduce",
            "nccl:_all_gather_base",
            "c10d::allreduce_",
            "c10d::_reduce_scatter_base_",
            "record_param_comms",
            "_c10d_functional::all_to_all_single",
        ]
    )
    from_args = pa.array([None, None, None, None, None, None, "allreduce", None], pa.string())
    assert taxonomy.collective_names(names, from_args).to_pylist() == [
        "allreduce",
        "sendrecv",
        "allreduce",
        "allgather",
        "allreduce",
        "reducescatter",
        "allreduce",
        "alltoall",
    ]


def test_distinct_answers_are_kept_only_inside_same_columns() -> None:
    names = pa.chunked_array([["a", "b", None], ["a"]])
    outside = taxonomy.distinct(names)
    assert outside.values.to_pylist() == ["a", "b", ""]
    assert outside.codes.tolist() == [0, 1, 2, 0]
    assert taxonomy.distinct(names) is not outside
    with taxonomy.same_columns():
        first = taxonomy.distinct(names)
        with taxonomy.same_columns():  # nested: the same scope
            assert taxonomy.distinct(names) is first
        # The same memory seen through a new wrapper (as table["name"] gives) is the same column.
        assert taxonomy.distinct(pa.chunked_array(names.chunks)) is first
        # Equal contents elsewhere in memory, or a slice of it, are other columns.
        assert taxonomy.distinct(pa.chunked_array([["a", "b", None], ["a"]])) is not first
        sliced = taxonomy.distinct(names.slice(1))
        assert sliced.codes.tolist() == [0, 1, 2]
        assert not first.codes.flags.writeable  # shared answers cannot be changed by a caller
    assert taxonomy.distinct(names) is not first
