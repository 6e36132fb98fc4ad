"""The agent's copy of its pod's plan, read from storage (docs/operator.md, "How the plan
reaches the ranks").

On Kubernetes the operator writes each target pod's plan twice: as the pod's annotation, which
the kubelet projects into the downward-API file the hooks read (at its own pace: within about a
second when its event-driven remount works, at its periodic resync otherwise, 60–90 s), and as
`<storage>/<namespace>/pod-plans/<pod uid>.json` (perfdiag.api.plan.pod_plan_key), which the
agent reads here every `poll_s` seconds with the storage credentials it already has. The agent
mirrors it into the spool (collector/hook/spool.py, `<spool>/agent/plan`: the plan text, empty
when there is none) and touches that file at every read that succeeds; the hooks read it while
it is fresh, so a plan reaches every rank within `poll_s` plus the hook's half-second poll.

A pod whose object holds a `watch` plan may have its next plan written once for every such pod
(perfdiag.api.plan.plan_successor_key): told to (`follow_successors`, which the operator's
webhook sets and then relies on), the agent reads that object too and mirrors the plan found
there instead.

When storage cannot be read the mirror is left alone: it goes stale after
spool.AGENT_PLAN_FRESH_S and the hooks read the kubelet's file again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from perfdiag.api.plan import Plan, plan_successor_key, pod_plan_key
from perfdiag.collector.hook import spool
from perfdiag.storage import Storage, StorageError, StorageNotFound

log = logging.getLogger("perfdiag.agent")

DEFAULT_POLL_S = 5.0
"""Seconds between two reads of the pod's plan: one small GET per pod each time, diagnosis or
not. The operator injects its own setting (settings.DEFAULT_AGENT_PLAN_POLL_SECONDS) and sets
its capture lead to cover it."""
MAX_PLAN_BYTES = 1 << 20  # as the hook: a larger plan is not a plan


@dataclass
class PodPlanFollower:
    """Keeps `<spool>/agent/plan` equal to the pod's plan in storage (`storage` is the
    namespace's: the agent's own --storage)."""

    storage: Storage
    pod_uid: str
    spool_dir: Path
    poll_s: float = DEFAULT_POLL_S
    follow_successors: bool = False
    _written: bytes | None = field(default=None, init=False)
    _logged: set[str] = field(default_factory=set, init=False)

    @property
    def key(self) -> str:
        return pod_plan_key(self.pod_uid)

    def poll_once(self) -> bool:
        """Read the plan and refresh the mirror; False when storage could not be read (the
        mirror is then left to go stale) or the mirror could not be written."""
        data = self.current_plan()
        if data is None:
            return False
        mirror = spool.agent_plan_file(self.spool_dir)
        try:
            if data != self._written or not mirror.exists():
                spool.write_bytes_atomic(mirror, data, dir_mode=spool.AGENT_DIR_MODE)
                if data != self._written:
                    log.info("pod plan: %s", data.decode("utf-8", "replace") or "none")
                self._written = data
            else:
                os.utime(mirror)  # confirmed now: the hooks keep reading it
        except OSError as exc:
            self._log_once(f"write:{exc}", f"cannot write {mirror}: {exc}")
            return False
        return True

    def current_plan(self) -> bytes | None:
        """The plan the pod's hooks should have (b"" for none): its object's, or, following
        successors, the successor of the watch plan it holds when there is one; None when
        storage could not be read."""
        data = self._read(self.key)
        if data is None or not self.follow_successors:
            return data
        successor = successor_key(data)
        if successor is None:
            return data
        followed = self._read(successor)
        if followed is None:
            return None
        return followed or data

    def _read(self, key: str) -> bytes | None:
        """The object's bytes, b"" when there is none; None when storage could not be read or
        it is too large to be a plan."""
        try:
            data = self.storage.get_bytes(key)
        except StorageNotFound:
            return b""  # no plan (the operator removes the object with the plan)
        except StorageError as exc:
            self._log_once(f"read:{exc}", f"cannot read the pod's plan {key}: {exc}")
            return None
        if len(data) > MAX_PLAN_BYTES:
            self._log_once(f"size:{key}", f"the pod's plan {key} is larger than {MAX_PLAN_BYTES} B")
            return None
        return data

    def run(self, stop: threading.Event) -> None:
        """Poll until `stop` is set. A read that fails leaves the mirror to go stale."""
        while True:
            try:
                self.poll_once()
            except Exception:  # a bug here must not end the thread: the hooks would fall back
                log.exception("following the pod's plan failed")
            if stop.wait(self.poll_s):
                return

    def start(self, stop: threading.Event) -> threading.Thread:
        """The polling thread (a daemon: the agent's window processing never delays it)."""
        thread = threading.Thread(target=self.run, args=(stop,), name="pod-plan", daemon=True)
        thread.start()
        return thread

    def _log_once(self, key: str, message: str) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning("%s", message)


def successor_key(pod_plan: bytes) -> str | None:
    """Where the plan that follows the pod's plan would be: only a valid `watch` plan has one
    (perfdiag.api.plan.plan_successor_key)."""
    try:
        plan = Plan.model_validate_json(pod_plan)
        return plan_successor_key(plan.id) if plan.action == "watch" else None
    except ValueError:
        return None  # none, or not a plan this version writes: mirrored as it is


def remove_mirror(spool_dir: Path) -> None:
    """Remove the agent's copy (an agent that stops following: the hooks read the kubelet's
    file at once)."""
    with contextlib.suppress(OSError):
        spool.agent_plan_file(spool_dir).unlink()
