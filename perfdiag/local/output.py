"""The output storage of a run, checked before anything is launched, and tidied when the run
ends without a capture."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from perfdiag.local.errors import CliError
from perfdiag.local.native_log import NATIVE_LOG_HINT, NativeLog
from perfdiag.storage import Storage, StorageError, layout, open_storage

# What perfdiag itself puts into the output before there is a capture: a folder holding only
# these holds nothing a user would open.
_NOT_A_CAPTURE = frozenset({layout.PLAN, layout.NATIVE_LOG})


@dataclass(frozen=True)
class Output:
    storage: Storage
    # The outermost local folder perfdiag made for the output (None: it was there, or the
    # output is not a local folder): removed again when the run ends without a capture.
    created: Path | None = None


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
    return open_output(uri, shared=shared).storage


def open_output(uri: str, *, shared: bool) -> Output:
    """prepare_output, also saying which local folder the probe created."""
    try:
        storage = open_storage(uri)
        if not shared and (storage.exists(layout.PLAN) or storage.list(layout.WORKERS)):
            raise CliError(
                f"{storage.uri} already holds a capture; choose another --out "
                "(or remove the old one)"
            )
        created = _outermost_missing(storage)
        probe = f".perfdiag-write-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        storage.put_bytes(probe, b"")
        storage.delete(probe)
    except StorageError as exc:
        raise CliError(f"output {uri} is not writable: {exc}") from exc
    return Output(storage, created)


def _outermost_missing(storage: Storage) -> Path | None:
    probe = storage.local_path(layout.PLAN)
    if probe is None:
        return None
    missing = None
    for folder in probe.parents:
        if folder.exists():
            break
        missing = folder
    return missing


def native_log_for(storage: Storage) -> NativeLog:
    """The profiler's native log of a run: a file in a local output folder, else dropped."""
    return NativeLog(storage.local_path(layout.NATIVE_LOG))


def wrap_up_output(
    output: Output,
    native_log: NativeLog | None,
    say: Callable[[str], None],
    *,
    failed: bool,
) -> None:
    """At the end of a local run: close the native log, and say where it is unless the
    analysis named it already. A run that failed without capturing anything leaves no folder
    behind that perfdiag created for it."""
    if native_log is not None:
        native_log.close()
    if failed and output.created is not None and _remove_if_no_capture(output):
        held_log = native_log is not None and native_log.written is not None
        say(
            f"nothing was captured: removed {output.storage.uri}, which perfdiag had created"
            + (f", with the profiler's native log; {NATIVE_LOG_HINT}" if held_log else "")
        )
        return
    if native_log is None or not native_log.lines:
        return
    # The analysis's "wrote …" line names a log next to the verdict it wrote.
    named = native_log.written is not None and output.storage.exists(layout.VERDICT)
    if failed or not named:
        say(native_log.where())


def _remove_if_no_capture(output: Output) -> bool:
    """Remove the plan and native log, then the folders perfdiag created, when nothing else is
    there. Never removes anything it did not write: a folder that is not empty stays."""
    plan, created = output.storage.local_path(layout.PLAN), output.created
    if plan is None or created is None:
        return False
    root = plan.parent
    if created != root and created not in root.parents:
        return False
    try:
        if not set(os.listdir(root)) <= _NOT_A_CAPTURE:
            return False
        for name in _NOT_A_CAPTURE:
            (root / name).unlink(missing_ok=True)
        for folder in (root, *root.parents):
            folder.rmdir()
            if folder == created:
                break
    except OSError:
        pass  # whatever could not be removed stays
    return not root.exists()
