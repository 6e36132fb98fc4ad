"""The workers' metadata and statuses as columns (docs/design.md §5).

A capture can hold 1,000,000 workers: a pydantic object per worker (WorkerMeta, WorkerStatus:
3 KB and 1.5 KB each) would take gigabytes, and every loop over them seconds. What the analysis
reads of every worker (rank, host, pod, world size, step bounds, phase, step, heartbeat times)
is kept in numpy and Arrow columns, each worker's document as its JSON text; the object of a
worker is made from its text when asked for (`metas[rank]`), for the few ranks a finding, the
report or the timeline names. Both classes are read-only Mappings rank → object, so code that
wants the objects of a few ranks reads them as from a dict.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray
from pydantic import BaseModel

from perfdiag.api.schema import WorkerMeta
from perfdiag.api.worker import WorkerStatus

Ints = NDArray[np.int64]
Floats = NDArray[np.float64]
M = TypeVar("M", bound=BaseModel)


def _text_column(values: Iterable[str | None]) -> pa.Array:
    # Dictionary-encoded: hosts repeat for every rank of a node, pods are one per rank.
    return pa.array(list(values), pa.string()).dictionary_encode()


def _concat_text(parts: Sequence[pa.Array]) -> pa.Array:
    if not parts:
        return _text_column([])
    plain = pa.concat_arrays([p.cast(pa.string()) if pa.types.is_dictionary(p.type) else p
                              for p in parts])  # fmt: skip
    return plain.dictionary_encode()


class _Documents(Mapping[int, M], Generic[M]):
    """Rank → object, the object made from the worker's JSON text on first use."""

    model: type[M]

    def __init__(self, ranks: Ints, documents: pa.Array) -> None:
        order = np.argsort(ranks, kind="stable")
        if not (order == np.arange(len(ranks))).all():
            raise ValueError("ranks must be ascending")
        self.ranks = np.asarray(ranks, np.int64)
        self.documents = documents
        self._made: dict[int, M] = {}

    def position(self, rank: int) -> int | None:
        at = int(np.searchsorted(self.ranks, rank))
        return at if at < len(self.ranks) and self.ranks[at] == rank else None

    def positions(self, ranks: Ints) -> Ints:
        """Each rank's position (−1 for ranks without a document)."""
        at = np.searchsorted(self.ranks, ranks)
        found = (at < len(self.ranks)) & (self.ranks[np.minimum(at, len(self.ranks) - 1)] == ranks)
        positions: Ints = np.where(found, at, -1)
        return positions

    def __getitem__(self, rank: int) -> M:
        made = self._made.get(rank)
        if made is not None:
            return made
        at = self.position(rank)
        if at is None:
            raise KeyError(rank)
        made = self.model.model_validate_json(self.documents[at].as_py())
        self._made[rank] = made
        return made

    def __contains__(self, rank: object) -> bool:
        return isinstance(rank, int | np.integer) and self.position(int(rank)) is not None

    def __iter__(self) -> Iterator[int]:
        return iter(self.ranks.tolist())

    def __len__(self) -> int:
        return len(self.ranks)


@dataclass(frozen=True)
class MetaColumns:
    """WorkerMeta fields of some workers, one entry per worker, ascending by rank."""

    ranks: Ints
    documents: pa.Array
    world_size: Ints
    """0 where the file states none."""
    host: pa.Array
    pod: pa.Array
    has_gpu: NDArray[np.bool_]
    start_step: Ints
    bound_counts: Ints
    bounds_ns: NDArray[np.int64]
    """(Σ bound_counts, 2) each worker's step bounds, one after the other."""
    host_usage: NDArray[np.bool_]

    @classmethod
    def of(cls, metas: Sequence[WorkerMeta], documents: Sequence[bytes]) -> MetaColumns:
        """Columns of validated objects (their JSON text beside them), in the order given."""
        n = len(metas)
        counts = np.fromiter((len(m.window.step_bounds_ns) for m in metas), np.int64, n)
        bounds = np.fromiter(
            (v for m in metas for pair in m.window.step_bounds_ns for v in pair),
            np.int64,
            int(counts.sum()) * 2,
        ).reshape(-1, 2)
        return cls(
            ranks=np.fromiter((m.rank for m in metas), np.int64, n),
            documents=pa.array(list(documents), pa.binary()),
            world_size=np.fromiter((m.world_size or 0 for m in metas), np.int64, n),
            host=_text_column(m.host for m in metas),
            pod=_text_column(m.pod for m in metas),
            has_gpu=np.fromiter((m.has_gpu for m in metas), bool, n),
            start_step=np.fromiter((m.window.start_step for m in metas), np.int64, n),
            bound_counts=counts,
            bounds_ns=bounds,
            host_usage=np.fromiter((m.host_usage is not None for m in metas), bool, n),
        )

    @classmethod
    def concat(cls, parts: Sequence[MetaColumns]) -> MetaColumns:
        if not parts:
            return cls.of([], [])
        return cls(
            ranks=np.concatenate([p.ranks for p in parts]),
            documents=pa.concat_arrays([p.documents for p in parts]),
            world_size=np.concatenate([p.world_size for p in parts]),
            host=_concat_text([p.host for p in parts]),
            pod=_concat_text([p.pod for p in parts]),
            has_gpu=np.concatenate([p.has_gpu for p in parts]),
            start_step=np.concatenate([p.start_step for p in parts]),
            bound_counts=np.concatenate([p.bound_counts for p in parts]),
            bounds_ns=np.concatenate([p.bounds_ns for p in parts]),
            host_usage=np.concatenate([p.host_usage for p in parts]),
        )

    def take(self, positions: Ints) -> MetaColumns:
        """The workers at `positions`."""
        starts = np.cumsum(self.bound_counts) - self.bound_counts
        counts = self.bound_counts[positions]
        rows = np.repeat(starts[positions], counts) + _ramp(counts)
        index = pa.array(positions, pa.int64())
        return MetaColumns(
            ranks=self.ranks[positions],
            documents=self.documents.take(index),
            world_size=self.world_size[positions],
            host=self.host.take(index),
            pod=self.pod.take(index),
            has_gpu=self.has_gpu[positions],
            start_step=self.start_step[positions],
            bound_counts=counts,
            bounds_ns=self.bounds_ns[rows],
            host_usage=self.host_usage[positions],
        )


def _ramp(counts: Ints) -> Ints:
    starts = np.cumsum(counts) - counts
    ramp: Ints = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts, counts)
    return ramp


class WorkerMetas(_Documents[WorkerMeta]):
    """Rank → WorkerMeta of the analysed workers, with their columns (`columns`)."""

    model = WorkerMeta

    def __init__(self, columns: MetaColumns) -> None:
        super().__init__(columns.ranks, columns.documents)
        self.columns = columns
        self._nodes: Nodes | None = None

    @classmethod
    def of(cls, metas: Mapping[int, WorkerMeta]) -> WorkerMetas:
        """From objects (a Kineto folder's ranks, the tests' captures)."""
        if isinstance(metas, WorkerMetas):
            return metas
        ranks = sorted(metas)
        objects = [metas[r] for r in ranks]
        made = cls(MetaColumns.of(objects, [m.model_dump_json().encode() for m in objects]))
        made._made.update(zip(ranks, objects, strict=True))
        return made

    def step_durations_ms(self) -> Floats:
        """(R, S) the duration of each step of each worker, ms; NaN past a worker's last."""
        c = self.columns
        width = int(c.bound_counts.max(initial=0))
        durations = np.full((len(c.ranks), max(width, 1)), np.nan)
        rows = np.repeat(np.arange(len(c.ranks)), c.bound_counts)
        durations[rows, _ramp(c.bound_counts)] = (c.bounds_ns[:, 1] - c.bounds_ns[:, 0]) / 1e6
        return durations

    def hosts(self) -> list[str | None]:
        """Each worker's host, in rank order."""
        hosts: list[str | None] = self.columns.host.to_pylist()
        return hosts

    def nodes(self) -> Nodes:
        """Which ranks run on which host (an empty name is none)."""
        if self._nodes is None:
            hosts = self.columns.host
            names = hosts.dictionary.to_pylist() if pa.types.is_dictionary(hosts.type) else []
            codes = hosts.indices.to_numpy(zero_copy_only=False) if names else None
            code = np.full(len(self.ranks), -1, np.int64)
            if codes is not None:
                valid = hosts.is_valid().to_numpy(zero_copy_only=False)
                code[valid] = codes[valid]
                empty = [i for i, name in enumerate(names) if not name]
                code[np.isin(code, empty)] = -1
            self._nodes = Nodes(self.ranks, code, names)
        return self._nodes

    def world_sizes(self) -> Ints:
        return self.columns.world_size

    def any_gpu(self) -> bool:
        return bool(self.columns.has_gpu.any())

    def all_host_usage(self, ranks: Ints) -> bool:
        """Whether every one of `ranks` carries its host usage."""
        positions = self.positions(ranks)
        return bool((positions >= 0).all() and self.columns.host_usage[positions].all())

    def window_start(self) -> tuple[int, int]:
        """(first start step, most steps) of the workers' windows; (0, 0) without workers."""
        c = self.columns
        if not len(c.ranks):
            return 0, 0
        return int(c.start_step.min()), int(c.bound_counts.max())


@dataclass(frozen=True)
class Nodes:
    """The analysed ranks by host."""

    ranks: Ints
    code: Ints
    """Per rank, its host's index in `names` (−1: no host named)."""
    names: list[str]

    def host_of(self, ranks: Iterable[int]) -> dict[int, str]:
        """The host of each of `ranks` that has one."""
        wanted = np.fromiter(ranks, np.int64)
        at = np.searchsorted(self.ranks, wanted)
        at = np.minimum(at, max(len(self.ranks) - 1, 0))
        out: dict[int, str] = {}
        for rank, position in zip(wanted.tolist(), at.tolist(), strict=True):
            if len(self.ranks) and self.ranks[position] == rank and self.code[position] >= 0:
                out[rank] = self.names[int(self.code[position])]
        return out

    def ranks_on(self, host: str) -> list[int]:
        codes = [i for i, name in enumerate(self.names) if name == host]
        ranks: list[int] = self.ranks[np.isin(self.code, codes)].tolist()
        return ranks

    def with_host(self) -> int:
        """How many ranks have a host."""
        return int((self.code >= 0).sum())

    def distinct(self) -> int:
        """How many hosts the ranks run on."""
        return len({self.names[c] for c in np.unique(self.code[self.code >= 0]).tolist()})


# -- statuses --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StatusColumns:
    """WorkerStatus fields of some workers, ascending by rank."""

    ranks: Ints
    documents: pa.Array
    phase: pa.Array
    step: Ints
    last_step_unix: Floats
    """NaN where the status states none."""
    updated_unix: Floats
    host: pa.Array
    pod: pa.Array

    @classmethod
    def of(
        cls, ranks: Sequence[int], statuses: Sequence[WorkerStatus], documents: Sequence[bytes]
    ) -> StatusColumns:
        """Columns of validated objects, keyed by the rank of the folder each was read from."""
        n = len(statuses)
        return cls(
            ranks=np.asarray(ranks, np.int64).reshape(n),
            documents=pa.array(list(documents), pa.binary()),
            phase=_text_column(s.phase for s in statuses),
            step=np.fromiter((s.step for s in statuses), np.int64, n),
            last_step_unix=np.fromiter(
                (math.nan if s.last_step_unix is None else s.last_step_unix for s in statuses),
                np.float64,
                n,
            ),
            updated_unix=np.fromiter((s.updated_unix for s in statuses), np.float64, n),
            host=_text_column(s.host for s in statuses),
            pod=_text_column(s.pod for s in statuses),
        )

    @classmethod
    def concat(cls, parts: Sequence[StatusColumns]) -> StatusColumns:
        if not parts:
            return cls.of([], [], [])
        return cls(
            ranks=np.concatenate([p.ranks for p in parts]),
            documents=pa.concat_arrays([p.documents for p in parts]),
            phase=_concat_text([p.phase for p in parts]),
            step=np.concatenate([p.step for p in parts]),
            last_step_unix=np.concatenate([p.last_step_unix for p in parts]),
            updated_unix=np.concatenate([p.updated_unix for p in parts]),
            host=_concat_text([p.host for p in parts]),
            pod=_concat_text([p.pod for p in parts]),
        )

    def take(self, positions: Ints) -> StatusColumns:
        """The workers at `positions`."""
        index = pa.array(positions, pa.int64())
        return StatusColumns(
            ranks=self.ranks[positions],
            documents=self.documents.take(index),
            phase=self.phase.take(index),
            step=self.step[positions],
            last_step_unix=self.last_step_unix[positions],
            updated_unix=self.updated_unix[positions],
            host=self.host.take(index),
            pod=self.pod.take(index),
        )


class WorkerStatuses(_Documents[WorkerStatus]):
    """Rank → WorkerStatus of the workers whose status.json was read, with their columns."""

    model = WorkerStatus

    def __init__(self, columns: StatusColumns) -> None:
        super().__init__(columns.ranks, columns.documents)
        self.columns = columns

    @classmethod
    def of(cls, statuses: Mapping[int, WorkerStatus]) -> WorkerStatuses:
        if isinstance(statuses, WorkerStatuses):
            return statuses
        ranks = sorted(statuses)
        objects = [statuses[r] for r in ranks]
        made = cls(
            StatusColumns.of(ranks, objects, [s.model_dump_json().encode() for s in objects])
        )
        made._made.update(zip(ranks, objects, strict=True))
        return made

    def failed(self) -> NDArray[np.bool_]:
        failed: NDArray[np.bool_] = np.asarray(
            self.columns.phase.cast(pa.string()).to_numpy(zero_copy_only=False) == "failed"
        )
        return failed

    def newest_unix(self) -> float | None:
        updated = self.columns.updated_unix
        return float(updated.max()) if len(updated) else None
