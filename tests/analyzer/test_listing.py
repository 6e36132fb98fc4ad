"""The listing of a capture's worker folders (analyzer/load/listing.py): ranks and file bits as
columns, the same workers whichever way the folders were listed."""

from __future__ import annotations

import numpy as np

from perfdiag.analyzer.load.listing import (
    MAX_REFUSED_NOTES,
    UNLISTED,
    bit,
    mask_of,
    merge_listings,
    parse_worker_folders,
    parse_worker_keys,
    stream_worker_keys,
)
from perfdiag.api.limits import MAX_RANKS
from perfdiag.storage import layout

URI = "/capture/workers"
NAMES_WRITTEN = (layout.STATUS, layout.SUMMARY, layout.HARDWARE)


def test_keys_become_ranks_and_file_bits() -> None:
    keys = [
        "workers/10/summary.parquet",
        "workers/10/status.json",
        "workers/2/status.json",
        "workers/2/notes.txt",  # another file: the folder is a worker's all the same
        "workers/007/summary.parquet",  # the rank its digits say
        "workers/3/sub/summary.parquet",  # deeper: no worker file
        "workers/x/summary.parquet",
        "workers/5/hardware.parquet",
        "plan.json",
    ]
    listing = parse_worker_keys(keys, URI)
    assert listing.ranks.tolist() == [2, 5, 7, 10]
    assert listing.ranks_with(layout.SUMMARY).tolist() == [7, 10]
    assert listing.ranks_with(layout.STATUS).tolist() == [2, 10]
    assert listing.ranks_with(layout.HARDWARE).tolist() == [5]
    assert listing.files[0] == bit(layout.STATUS)
    assert listing.keys == len(keys) and listing.notes == []


def test_folders_above_the_rank_limit_are_noted_a_few_at_a_time() -> None:
    above = [f"workers/{MAX_RANKS + i}/summary.parquet" for i in range(MAX_REFUSED_NOTES + 5)]
    keys = ["workers/1/summary.parquet", "workers/99999999999999999999/status.json", *above]
    listing = parse_worker_keys(keys, URI)
    assert listing.ranks.tolist() == [1]
    assert len(listing.notes) == MAX_REFUSED_NOTES + 1
    assert listing.notes[0] == (
        f"ignored {URI}/{MAX_RANKS}/: rank {MAX_RANKS} is above the limit of "
        f"{MAX_RANKS:,} ranks (docs/limits.md)"
    )
    assert listing.notes[-1].startswith("ignored 6 more worker folders above the limit")


def test_folder_names_give_the_same_ranks_their_files_unlisted() -> None:
    names = ["10", "2", "007", "x", "5", str(MAX_RANKS), ".hidden", "99999999999999999999"]
    listing = parse_worker_folders(names, URI)
    assert listing.ranks.tolist() == [2, 5, 7, 10]
    assert (listing.files == UNLISTED).all() and listing.any_file()
    assert len(listing.notes) == 2
    assert mask_of(["status.json", "summary.parquet", "other"]) == (
        bit(layout.STATUS) | bit(layout.SUMMARY)
    )
    empty = parse_worker_folders([], URI)
    assert len(empty) == 0 and not empty.any_file()
    assert np.array_equal(parse_worker_keys([], URI).ranks, empty.ranks)


def test_keys_listed_in_pages_give_the_listing_of_all_keys_at_once() -> None:
    keys = sorted(
        [f"workers/{r}/{name}" for r in range(0, 40, 3) for name in NAMES_WRITTEN]
        + ["workers/7/notes.txt", f"workers/{MAX_RANKS + 1}/summary.parquet"]
    )
    whole = parse_worker_keys(keys, URI)
    for size in (1, 2, 5, 1000):  # a folder's keys split over pages, or not
        pages = [keys[i : i + size] for i in range(0, len(keys), size)]
        parts = list(stream_worker_keys([[], *pages, []], URI))
        merged = merge_listings(parts, URI)
        assert merged.ranks.tolist() == whole.ranks.tolist()
        assert merged.files.tolist() == whole.files.tolist()
        assert merged.keys == whole.keys and merged.notes == whole.notes
        # Each folder comes whole in one part.
        assert sum(len(p) for p in parts) == len(whole)
