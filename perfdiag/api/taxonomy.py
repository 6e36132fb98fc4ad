"""The event taxonomy (docs/design.md §4): every event's category, and how the critical path ranks it.

Categories come from Kineto's own category (`cat`) and, where that is not enough, the event
name. All functions are vectorized: the rules run once per distinct (cat, name) pair of a
table and the answers are spread back with the dictionary indices.

Charging rules used by perfdiag.engine.critical_path (docs/engine.md explains the choices):
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
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from perfdiag.api.schema import CATEGORIES

# Kineto category → how perfdiag reads it. None: not a duration event (flows, instants,
# metadata), dropped on import.
KINETO_CATEGORIES: dict[str, str | None] = {
    "kernel": "gpu_compute (communication for NCCL kernels)",
    "gpu_memcpy": "gpu_memory",
    "gpu_memset": "gpu_memory",
    "cuda_runtime": "cuda_runtime",
    "cuda_driver": "cuda_runtime",
    "cuda_sync": "cuda_runtime",
    "python_function": "python (dataloader under torch/utils/data/, communication for c10d waits)",
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
# The Python frame of a blocking wait on a collective (Work.wait(), a c10d future).
_COMM_WAIT_PYTHON = r"^<built-in method wait of torch\._C\._distributed_c10d\."
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
Column: TypeAlias = "pa.Array | pa.ChunkedArray"


class Distinct(NamedTuple):
    """A column as its distinct values and, per row, the index of its value."""

    values: pa.Array
    codes: IntArray

    def mask(self, per_value: BoolArray) -> BoolArray:
        """Spread a per-value boolean to the rows."""
        if not len(per_value):
            return np.zeros(len(self.codes), dtype=bool)
        result: BoolArray = per_value[self.codes]
        return result


def distinct(values: Column | Distinct) -> Distinct:
    """Distinct values and row indices of a column (nulls read as "").

    Inside `same_columns()`, the answer for a column is kept and given again when the same
    column (the same memory) is asked for: the import and the summary of one trace ask this
    of a few columns a dozen times."""
    if isinstance(values, Distinct):
        return values
    kept: dict[tuple[object, ...], tuple[Column, Distinct]] | None = getattr(_SCOPE, "kept", None)
    key = _memory_key(values) if kept is not None else None
    if kept is None or key is None:
        return _distinct(values)
    if key not in kept:
        # The column is kept with its answer: its memory cannot be reused for other data
        # while the key is in use.
        kept[key] = (values, _distinct(values))
    return kept[key][1]


@contextmanager
def same_columns() -> Iterator[None]:
    """Remember `distinct` answers on this thread until the outermost block ends."""
    outermost = getattr(_SCOPE, "kept", None) is None
    if outermost:
        _SCOPE.kept = {}
    try:
        yield
    finally:
        if outermost:
            _SCOPE.kept = None


def keep_answers_for(table: pa.Table) -> None:
    """Inside `same_columns()`: drop the `distinct` answers kept for columns that are not
    `table`'s, so that the tables a result was built from can be freed (a trace's raw events
    once its events table is built)."""
    kept: dict[tuple[object, ...], tuple[Column, Distinct]] | None = getattr(_SCOPE, "kept", None)
    if not kept:
        return
    wanted = {_memory_key(column) for column in table.columns}
    for key in [key for key in kept if key not in wanted]:
        del kept[key]


_SCOPE = threading.local()


def _memory_key(values: Column) -> tuple[object, ...] | None:
    """Where a column's data lives: equal keys of live columns mean equal contents."""
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    key: list[object] = [str(values.type)]
    for chunk in chunks:
        if chunk.type.num_fields:  # nested data: not worth keying
            return None
        buffers = chunk.buffers()
        key.append((chunk.offset, len(chunk), *(b.address if b else 0 for b in buffers)))
    return tuple(key)


def _distinct(values: Column) -> Distinct:
    array = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    encoded = pc.dictionary_encode(pc.fill_null(array, ""))
    if isinstance(encoded, pa.ChunkedArray):  # pragma: no cover - combine_chunks gives an Array
        encoded = encoded.combine_chunks()
    indices = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    indices.setflags(write=False)  # may be shared by every caller asking for the column
    return Distinct(encoded.dictionary, indices)


def _matches(values: pa.Array, pattern: str) -> BoolArray:
    return np.asarray(pc.match_substring_regex(values, pattern).to_numpy(zero_copy_only=False))


def _lower(values: pa.Array) -> list[str]:
    return [str(v).lower() for v in values.to_pylist()]


_CATEGORY_NAMES = pa.array(CATEGORIES, pa.string())
_CODE = {name: code for code, name in enumerate(CATEGORIES)}


def categorize(kineto_cat: Column | Distinct, name: Column | Distinct) -> pa.Array:
    """The taxonomy category of each event (perfdiag.api.schema.Category)."""
    cats, names = distinct(kineto_cat), distinct(name)
    lower = _lower(cats.values)

    def cat_is(*wanted: str) -> BoolArray:
        return cats.mask(np.array([c in wanted for c in lower], dtype=bool))

    def name_is(pattern: str) -> BoolArray:
        return names.mask(_matches(names.values, pattern))

    code = np.full(len(cats.codes), _CODE["other"], dtype=np.int8)
    kernel = cat_is("kernel")
    code[kernel] = _CODE["gpu_compute"]
    code[kernel & name_is(_NCCL_KERNEL)] = _CODE["communication"]
    code[cat_is("gpu_memcpy", "gpu_memset")] = _CODE["gpu_memory"]
    code[cat_is("cuda_runtime", "cuda_driver", "cuda_sync")] = _CODE["cuda_runtime"]
    python = cat_is("python_function")
    code[python] = _CODE["python"]
    code[python & name_is(_DATALOADER_PYTHON)] = _CODE["dataloader"]
    code[python & name_is(_COMM_WAIT_PYTHON)] = _CODE["communication"]
    code[cat_is("gc")] = _CODE["gc"]
    host_ops = cat_is("cpu_op", "operator")
    code[host_ops] = _CODE["cpu_op"]
    ranges = cat_is("user_annotation")
    code[ranges | cat_is("gpu_user_annotation", "trace")] = _CODE["annotation"]
    named_host = host_ops | ranges
    code[named_host & name_is(_DATALOADER_RANGE)] = _CODE["dataloader"]
    code[named_host & name_is(_COMM_OP)] = _CODE["communication"]
    encoded = pa.DictionaryArray.from_arrays(pa.array(code, pa.int8()), _CATEGORY_NAMES)
    return pc.cast(encoded, pa.string())


def is_container(kineto_cat: Column | Distinct, name: Column | Distinct) -> BoolArray:
    """Ranges that only frame other work (never charged on the critical path)."""
    cats, names = distinct(kineto_cat), distinct(name)
    lower = _lower(cats.values)
    always = cats.mask(np.array([c in ("gpu_user_annotation", "trace") for c in lower], dtype=bool))
    by_name = cats.mask(np.array([c in ("user_annotation", "cpu_op") for c in lower], dtype=bool))
    return always | (by_name & names.mask(_matches(names.values, _CONTAINER_RANGE)))


def is_device(kineto_cat: Column | Distinct) -> BoolArray:
    """Events that run on a GPU (their pid is the device, their tid the stream)."""
    cats = distinct(kineto_cat)
    return cats.mask(np.array([c in DEVICE_CATEGORIES for c in _lower(cats.values)], dtype=bool))


def charge_class(category: Column | Distinct, on_device: BoolArray) -> npt.NDArray[np.int8]:
    """The charge class of each event (higher wins when activities overlap)."""
    cats = distinct(category)
    names = [str(c) for c in cats.values.to_pylist()]
    per_cat = np.array([_CLASS_OF_CATEGORY.get(c, CLASS_HOST_WORK) for c in names], dtype=np.int8)
    classes = per_cat[cats.codes] if len(per_cat) else np.zeros(len(cats.codes), dtype=np.int8)
    comm = cats.mask(np.array([c == "communication" for c in names], dtype=bool))
    classes[comm & on_device] = CLASS_DEVICE_COMM
    return classes


def is_enclosing(category: Column | Distinct) -> BoolArray:
    """Spans that keep the time of the work nested inside them (data loading, GC, collectives)."""
    cats = distinct(category)
    names = [str(c) for c in cats.values.to_pylist()]
    return cats.mask(np.array([c in ENCLOSING_CATEGORIES for c in names], dtype=bool))


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def function_names(name: Column | Distinct) -> pa.Array:
    """Names as the summary shows them: the same on every rank (no object addresses, one name
    for all ProfilerStep#N)."""
    names = distinct(name)
    cleaned = pc.replace_substring_regex(names.values, _ADDRESS.pattern, "")
    cleaned = pc.replace_substring_regex(cleaned, r"^ProfilerStep#\d+$", "ProfilerStep#*")
    return cleaned.take(pa.array(names.codes))


# Collective names, one spelling for all sources: record_param_comms' "allreduce", NCCL kernel
# "AllReduce", gloo annotation "all_reduce", c10d op "allreduce_" → "allreduce".
_COLLECTIVE_FROM_NAME = [
    (r"^(?:ncclDevKernel|ncclKernel)_([A-Za-z]+)", 1),
    (r"^(?:gloo|nccl):([A-Za-z_]+)", 1),
    (r"^(?:_?c10d(?:_functional)?)::_?([A-Za-z_]+?)_?$", 1),
]


def collective_names(name: Column | Distinct, from_args: Column) -> pa.Array:
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


COMMUNICATION = "communication"
"""The category of collective and point-to-point communication events."""

COLLECTIVE_WAIT_PREFIXES: tuple[str, ...] = ("<built-in method wait of ",)
"""Python frames that block on a collective (c10d Work.wait / Future.wait bindings): waiting,
whatever category the taxonomy gave them (the profiler records them as python_function)."""
