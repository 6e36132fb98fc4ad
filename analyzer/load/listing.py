"""Which workers left which files: the listing of `workers/` as two columns.

A capture of N workers lists 2N–3N keys; read into a set of file names per rank, 1,000,000
workers were a million Python sets. The keys are parsed by Arrow instead: a rank and a bitmask
of the layout's file names per worker folder. A listing can come in pages (S3: 1,000 keys a
request), parsed as they come, so that the workers of the first pages are read while the next
are listed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from perfdiag.api.limits import MAX_RANKS, rank_problem
from perfdiag.storage import layout

Ints = NDArray[np.int64]

NAMES = (
    layout.SUMMARY,
    layout.STATUS,
    layout.STACKS,
    layout.FLIGHT_RECORDER,
    layout.HARDWARE,
    layout.EVENTS,
)
"""The worker files the analysis reads, bit i of a worker's mask for NAMES[i]."""
UNLISTED = 1 << 7
"""A worker folder whose files are not listed yet (a local capture: each is listed where it is
read, by the pool's processes)."""
MAX_REFUSED_NOTES = 10
"""Worker folders refused one note each, up to this many; the others are counted."""

_KEY = r"^workers/(?P<rank>[0-9]{1,18})/(?P<name>[^/]+)$"
_LONG_RANK = r"^workers/[0-9]{19,}/[^/]+$"
_FOLDER = r"^[0-9]{1,18}$"
_LONG_FOLDER = r"^[0-9]{19,}$"


def bit(name: str) -> int:
    return 1 << NAMES.index(name)


def mask_of(names: list[str]) -> int:
    """The bits of the NAMES among a folder's file names."""
    return sum(1 << i for i, name in enumerate(NAMES) if name in names)


@dataclass(frozen=True)
class WorkerListing:
    ranks: Ints
    """Ranks with any file in their folder, ascending."""
    files: NDArray[np.uint8]
    """Per rank, the bits of the NAMES found in its folder."""
    keys: int = 0
    """Keys listed under workers/."""
    refused: list[int] = field(default_factory=list)
    """Worker folders above the rank limit, ascending: not read."""
    folder_uri: str = ""

    @property
    def notes(self) -> list[str]:
        """A note per refused folder (the first few, then their count)."""
        notes = [
            f"ignored {self.folder_uri}/{rank}/: {rank_problem(rank)}"
            for rank in self.refused[:MAX_REFUSED_NOTES]
        ]
        if len(self.refused) > MAX_REFUSED_NOTES:
            notes.append(
                f"ignored {len(self.refused) - MAX_REFUSED_NOTES:,} more worker folders above "
                f"the limit of {MAX_RANKS:,} ranks (docs/limits.md)"
            )
        return notes

    def has(self, name: str) -> NDArray[np.bool_]:
        found: NDArray[np.bool_] = (self.files & bit(name)) != 0
        return found

    def ranks_with(self, name: str) -> Ints:
        return self.ranks[self.has(name)]

    def any_file(self) -> bool:
        """Whether a worker folder holds a file (a listed one, or one not listed yet)."""
        return bool((self.files != 0).any())

    def __len__(self) -> int:
        return len(self.ranks)


def _empty(folder_uri: str) -> WorkerListing:
    return WorkerListing(np.zeros(0, np.int64), np.zeros(0, np.uint8), folder_uri=folder_uri)


def merge_listings(parts: Sequence[WorkerListing], folder_uri: str) -> WorkerListing:
    """One listing of the parts (of disjoint workers), in rank order."""
    if not parts:
        return _empty(folder_uri)
    ranks = np.concatenate([p.ranks for p in parts])
    files = np.concatenate([p.files for p in parts])
    order = np.argsort(ranks, kind="stable")
    return WorkerListing(
        ranks[order],
        files[order],
        keys=sum(p.keys for p in parts),
        refused=sorted({r for p in parts for r in p.refused}),
        folder_uri=folder_uri,
    )


def parse_worker_folders(names: list[str], folder_uri: str) -> WorkerListing:
    """The worker folders among the `names` in workers/, their files not listed yet."""
    if not names:
        return _empty(folder_uri)
    column = pa.array(names, pa.string())
    digits = pc.match_substring_regex(column, _FOLDER)
    ranks = pc.cast(column.filter(digits), pa.int64()).to_numpy()
    long = column.filter(pc.match_substring_regex(column, _LONG_FOLDER)).to_pylist()
    refused = sorted({*np.unique(ranks[ranks >= MAX_RANKS]).tolist(), *map(int, long)})
    ranks = np.unique(ranks[ranks < MAX_RANKS])
    files = np.full(len(ranks), UNLISTED, np.uint8)
    return WorkerListing(ranks, files, refused=refused, folder_uri=folder_uri)


def parse_worker_keys(keys: list[str], folder_uri: str) -> WorkerListing:
    """The listing of `keys` (relative to the capture); `folder_uri` names a refused folder."""
    if not keys:
        return _empty(folder_uri)
    column = pa.array(keys, pa.string())
    parts = pc.extract_regex(column, _KEY)
    matched = parts.is_valid()
    ranks = pc.cast(parts.field("rank").filter(matched), pa.int64()).to_numpy()
    names = pc.index_in(parts.field("name").filter(matched), value_set=pa.array(NAMES))
    bits = np.left_shift(1, names.fill_null(len(NAMES) + 1).to_numpy()).astype(np.int64)
    bits[bits >= 1 << len(NAMES)] = 0  # another file: the folder is a worker's all the same
    long = column.filter(pc.match_substring_regex(column, _LONG_RANK)).to_pylist()
    refused = sorted(
        {*np.unique(ranks[ranks >= MAX_RANKS]).tolist(), *(int(k.split("/")[1]) for k in long)}
    )
    kept = ranks < MAX_RANKS
    ranks, bits = ranks[kept], bits[kept]
    order = np.argsort(ranks, kind="stable")
    ranks, bits = ranks[order], bits[order]
    if not len(ranks):
        return WorkerListing(ranks, bits.astype(np.uint8), len(keys), refused, folder_uri)
    first = np.flatnonzero(np.r_[True, ranks[1:] != ranks[:-1]])
    files = np.bitwise_or.reduceat(bits, first).astype(np.uint8)
    return WorkerListing(ranks[first], files, len(keys), refused, folder_uri)


def stream_worker_keys(pages: Iterable[list[str]], folder_uri: str) -> Iterator[WorkerListing]:
    """The listing of keys that come in pages, a part per page. A folder's keys are consecutive
    in a listing (sorted by key): only the last folder of a page may go on in the next, so its
    keys wait for that page."""
    held: list[str] = []
    for page in pages:
        keys = held + page
        if not keys:
            continue
        last = _folder(keys[-1])
        cut = len(keys)
        while cut and _folder(keys[cut - 1]) == last:
            cut -= 1
        held = keys[cut:]
        if cut:
            yield parse_worker_keys(keys[:cut], folder_uri)
    if held:
        yield parse_worker_keys(held, folder_uri)


def _folder(key: str) -> str:
    return key.rsplit("/", 1)[0]
