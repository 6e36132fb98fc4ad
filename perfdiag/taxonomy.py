"""The event taxonomy (DESIGN.md §4): every event's category, and how the critical path ranks it.

Categories come from Kineto's own category (`cat`) and, where that is not enough, the event
name. All functions are vectorized: the rules run once per distinct (cat, name) pair of a
table and the answers are spread back with the dictionary indices.

Charging rules used by perfdiag.critical_path (docs/engine.md explains the choices):
- *containers* — ProfilerStep#N, Optimizer.step#…/Optimizer.zero_grad#… ranges, GPU-side user
  annotations and Kineto's own "Trace" spans — frame other work and are never charged;
- on one thread the innermost event is charged (self time), except that *enclosing* spans of
  data loading, GC and communication keep the time of what runs inside them;
- across threads and streams the highest *charge class* wins:
  GPU compute > GPU memory > communication on the GPU > host work (aten ops, data loading, GC,
  CUDA runtime, other) > communication on the host (gloo/c10d) > Python and user-range self time.
"""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

# Kineto category → how perfdiag reads it. None: not a duration event (flows, instants,
# metadata), dropped on import.
KINETO_CATEGORIES: dict[str, str | None] = {
    "kernel": "gpu_compute (communication for NCCL kernels)",
    "gpu_memcpy": "gpu_memory",
    "gpu_memset": "gpu_memory",
    "cuda_runtime": "cuda_runtime",
    "cuda_driver": "cuda_runtime",
    "cuda_sync": "cuda_runtime",
    "python_function": "python (dataloader under torch/utils/data/)",
    "cpu_op": "cpu_op (communication for c10d/record_param_comms ops)",
    "operator": "cpu_op (old name of cpu_op)",
    "user_annotation": "annotation (dataloader, communication or container by name)",
    "gpu_user_annotation": "annotation (container)",
    "trace": "annotation (container: the profiling session)",
    "gc": "gc (the hook's GC records)",
    "ac2g": None,
    "fwdbwd": None,
    "async_cpu_to_gpu": None,
    "flow": None,
    "cpu_instant_event": None,
}

DEVICE_CATEGORIES = frozenset(
    {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"}
)

_NCCL_KERNEL = r"^(ncclDevKernel|ncclKernel)"
_COMM_OP = (
    r"^(record_param_comms$|c10d::|c10d_functional::|_c10d_functional::|gloo:|nccl:"
    r"|ProcessGroupNCCL::|ProcessGroupGloo::)"
)
_DATALOADER_RANGE = r"^enumerate\(DataLoader\)#"
_DATALOADER_PYTHON = r"^torch/utils/data/"
_CONTAINER_RANGE = r"^(ProfilerStep#|Optimizer\.step#|Optimizer\.zero_grad#)"

# Charge classes: higher wins when activities overlap in time.
CLASS_HOST_OVERHEAD = 1  # Python frames, self time of user ranges
CLASS_HOST_COMM = 2  # gloo/c10d communication seen on host threads
CLASS_HOST_WORK = 3  # aten ops, data loading, GC, CUDA runtime, other
CLASS_DEVICE_COMM = 4  # NCCL kernels
CLASS_GPU_MEMORY = 5
CLASS_GPU_COMPUTE = 6

_CLASS_OF_CATEGORY = {
    "gpu_compute": CLASS_GPU_COMPUTE,
    "gpu_memory": CLASS_GPU_MEMORY,
    "communication": CLASS_HOST_COMM,  # CLASS_DEVICE_COMM on GPU streams
    "cuda_runtime": CLASS_HOST_WORK,
    "cpu_op": CLASS_HOST_WORK,
    "dataloader": CLASS_HOST_WORK,
    "gc": CLASS_HOST_WORK,
    "other": CLASS_HOST_WORK,
    "python": CLASS_HOST_OVERHEAD,
    "annotation": CLASS_HOST_OVERHEAD,
}

# Spans that keep the time of the work nested inside them on their thread.
ENCLOSING_CATEGORIES = frozenset({"dataloader", "gc", "communication"})

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


def distinct(values: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, IntArray]:
    """Distinct values and, per row, the index of its value (nulls read as "")."""
    array = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    encoded = pc.dictionary_encode(pc.fill_null(array, ""))
    if isinstance(encoded, pa.ChunkedArray):  # pragma: no cover - combine_chunks gives an Array
        encoded = encoded.combine_chunks()
    indices = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return encoded.dictionary, indices


def _matches(values: pa.Array, pattern: str) -> BoolArray:
    return np.asarray(pc.match_substring_regex(values, pattern).to_numpy(zero_copy_only=False))


def categorize(
    kineto_cat: pa.Array | pa.ChunkedArray, name: pa.Array | pa.ChunkedArray
) -> pa.Array:
    """The taxonomy category of each event (perfdiag.schema.Category)."""
    cats, cat_idx = distinct(kineto_cat)
    names, name_idx = distinct(name)
    lower = [str(c).lower() for c in cats.to_pylist()]

    def cat_is(*wanted: str) -> BoolArray:
        per_cat = np.array([c in wanted for c in lower], dtype=bool)
        return per_cat[cat_idx] if len(per_cat) else np.zeros(len(cat_idx), dtype=bool)

    def name_is(pattern: str) -> BoolArray:
        per_name = _matches(names, pattern)
        return per_name[name_idx] if len(per_name) else np.zeros(len(name_idx), dtype=bool)

    n = len(cat_idx)
    out = np.full(n, "other", dtype=object)
    kernel = cat_is("kernel")
    out[kernel] = "gpu_compute"
    out[kernel & name_is(_NCCL_KERNEL)] = "communication"
    out[cat_is("gpu_memcpy", "gpu_memset")] = "gpu_memory"
    out[cat_is("cuda_runtime", "cuda_driver", "cuda_sync")] = "cuda_runtime"
    python = cat_is("python_function")
    out[python] = "python"
    out[python & name_is(_DATALOADER_PYTHON)] = "dataloader"
    out[cat_is("gc")] = "gc"
    host_ops = cat_is("cpu_op", "operator")
    out[host_ops] = "cpu_op"
    ranges = cat_is("user_annotation")
    out[ranges] = "annotation"
    out[cat_is("gpu_user_annotation", "trace")] = "annotation"
    named_host = host_ops | ranges
    out[named_host & name_is(_DATALOADER_RANGE)] = "dataloader"
    out[named_host & name_is(_COMM_OP)] = "communication"
    return pa.array(out, pa.string())


def is_container(
    kineto_cat: pa.Array | pa.ChunkedArray, name: pa.Array | pa.ChunkedArray
) -> BoolArray:
    """Ranges that only frame other work (never charged on the critical path)."""
    cats, cat_idx = distinct(kineto_cat)
    names, name_idx = distinct(name)
    lower = [str(c).lower() for c in cats.to_pylist()]
    always = np.array([c in ("gpu_user_annotation", "trace") for c in lower], dtype=bool)
    by_name = np.array([c in ("user_annotation", "cpu_op") for c in lower], dtype=bool)
    container_name = _matches(names, _CONTAINER_RANGE)
    if not len(cat_idx):
        return np.zeros(0, dtype=bool)
    result: BoolArray = always[cat_idx] | (by_name[cat_idx] & container_name[name_idx])
    return result


def is_device(kineto_cat: pa.Array | pa.ChunkedArray) -> BoolArray:
    """Events that run on a GPU (their pid is the device, their tid the stream)."""
    cats, cat_idx = distinct(kineto_cat)
    per_cat = np.array([str(c).lower() in DEVICE_CATEGORIES for c in cats.to_pylist()], dtype=bool)
    if not len(cat_idx):
        return np.zeros(0, dtype=bool)
    result: BoolArray = per_cat[cat_idx]
    return result


def charge_class(
    category: pa.Array | pa.ChunkedArray, on_device: BoolArray
) -> npt.NDArray[np.int8]:
    """The charge class of each event (higher wins when activities overlap)."""
    cats, idx = distinct(category)
    per_cat = np.array(
        [_CLASS_OF_CATEGORY.get(str(c), CLASS_HOST_WORK) for c in cats.to_pylist()], dtype=np.int8
    )
    classes = per_cat[idx] if len(idx) else np.zeros(0, dtype=np.int8)
    comm = np.array([c == "communication" for c in cats.to_pylist()], dtype=bool)
    if len(idx):
        classes[comm[idx] & on_device] = CLASS_DEVICE_COMM
    return classes


def is_enclosing(category: pa.Array | pa.ChunkedArray) -> BoolArray:
    """Spans that keep the time of the work nested inside them (data loading, GC, collectives)."""
    cats, idx = distinct(category)
    per_cat = np.array([str(c) in ENCLOSING_CATEGORIES for c in cats.to_pylist()], dtype=bool)
    if not len(idx):
        return np.zeros(0, dtype=bool)
    result: BoolArray = per_cat[idx]
    return result


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def function_names(name: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Names as the summary shows them: the same on every rank (no object addresses, one name
    for all ProfilerStep#N)."""
    names, idx = distinct(name)
    cleaned = pc.replace_substring_regex(names, _ADDRESS.pattern, "")
    cleaned = pc.replace_substring_regex(cleaned, r"^ProfilerStep#\d+$", "ProfilerStep#*")
    return cleaned.take(pa.array(idx))


# Collective names, one spelling for all sources: record_param_comms' "allreduce", NCCL kernel
# "AllReduce", gloo annotation "all_reduce", c10d op "allreduce_" → "allreduce".
_COLLECTIVE_FROM_NAME = [
    (r"^(?:ncclDevKernel|ncclKernel)_([A-Za-z]+)", 1),
    (r"^(?:gloo|nccl):([A-Za-z_]+)", 1),
    (r"^(?:_?c10d(?:_functional)?)::_?([A-Za-z_]+?)_?$", 1),
]


def collective_names(
    name: pa.Array | pa.ChunkedArray, from_args: pa.Array | pa.ChunkedArray
) -> pa.Array:
    """The collective of each communication event (args first, else parsed from the name),
    normalized ("allreduce", "allgather", "reducescatter", "broadcast", "alltoall", "send"…)."""
    names, idx = distinct(name)
    parsed: list[str | None] = []
    for text in names.to_pylist():
        found = None
        for pattern, group in _COLLECTIVE_FROM_NAME:
            match = re.match(pattern, text)
            if match:
                found = match.group(group)
                break
        parsed.append(found)
    by_name = pa.array(parsed, pa.string()).take(pa.array(idx))
    args = from_args.combine_chunks() if isinstance(from_args, pa.ChunkedArray) else from_args
    chosen = pc.coalesce(args, by_name)
    return normalize_collective(chosen)


def normalize_collective(values: pa.Array) -> pa.Array:
    lowered = pc.utf8_lower(values)
    compact = pc.replace_substring_regex(lowered, r"[^a-z0-9]", "")
    compact = pc.replace_substring_regex(
        compact, r"(base|coalesced|intotensor|tensor|single)+$", ""
    )
    return pc.if_else(pc.equal(compact, ""), pa.scalar(None, pa.string()), compact)
