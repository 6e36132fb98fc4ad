"""The output storage of a run, checked before anything is launched."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from perfdiag.cli import CliError
from perfdiag.storage import Storage, StorageError, layout, open_storage


def default_out(prefix: str = "perfdiag") -> str:
    """A new folder in the current directory, named by the time of the run."""
    name = f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"
    candidate, n = name, 1
    while Path(candidate).exists():
        n += 1
        candidate = f"{name}-{n}"
    return candidate


def prepare_output(uri: str, *, shared: bool) -> Storage:
    """Open `uri` and prove it is writable (write and delete a probe), so that training is
    never started for a capture that could not be saved. A capture already there is refused,
    unless the output is `shared` by the nodes of a multi-node run."""
    try:
        storage = open_storage(uri)
        if not shared and (storage.exists(layout.PLAN) or storage.list(layout.WORKERS)):
            raise CliError(
                f"{storage.uri} already holds a capture; choose another --out "
                "(or remove the old one)"
            )
        probe = f".perfdiag-write-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        storage.put_bytes(probe, b"")
        storage.delete(probe)
    except StorageError as exc:
        raise CliError(f"output {uri} is not writable: {exc}") from exc
    return storage
