"""The reconciler's per-pod work at scale (no cluster: a Kube that records its calls, a local
folder as storage): the pods' annotations are patched a few at a time, and the workers'
statuses read a few at a time, so that a pass over 10,000 pods is not 10,000 round trips in a
row (docs/benchmarks.md, "Control plane at scale")."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast

import pytest

from perfdiag.api.plan import Plan
from perfdiag.api.worker import WorkerStatus
from perfdiag.operator.kube import Kube
from perfdiag.operator.reconcile import POD_PATCHERS, Reconciler, _worker_statuses
from perfdiag.operator.settings import OperatorConfig
from perfdiag.storage import layout
from perfdiag.storage.local import LocalStorage

PLAN = Plan(id="d-1234", steps=5, deadline=datetime.now(timezone.utc) + timedelta(hours=1))
PODS = 200


class OverlapKube:
    """Records the patches and how many were in flight at once."""

    def __init__(self) -> None:
        self.patched: list[str] = []
        self.in_flight = 0
        self.most = 0
        self.lock = threading.Lock()
        self.together = threading.Barrier(2, timeout=10)

    def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        if name in ("p0", "p1"):
            self.together.wait()  # one at a time, these two would never meet: BrokenBarrier
        with self.lock:
            self.in_flight -= 1
            self.patched.append(name)


def test_every_pod_is_patched_and_several_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PERFDIAG_STORAGE", str(tmp_path / "store"))
    kube = OverlapKube()
    reconciler = Reconciler(cast(Kube, kube), OperatorConfig())
    pods = [{"metadata": {"name": f"p{i}", "uid": f"u{i}"}} for i in range(PODS)]
    assert reconciler._send_plan("ns", "d", PLAN, pods) is None
    assert sorted(kube.patched) == sorted(f"p{i}" for i in range(PODS))
    assert 2 <= kube.most <= POD_PATCHERS


def test_every_workers_status_is_read(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "capture")
    for rank in range(PODS):
        plan = "other" if rank == 7 else PLAN.id
        status = WorkerStatus(rank=rank, plan_id=plan, updated_unix=1.0, step=rank)
        storage.put_text(layout.worker_key(rank, layout.STATUS), status.model_dump_json())
    storage.put_text(layout.worker_key(3, "other.json"), "{}")
    found = _worker_statuses(storage, PLAN.id)
    assert sorted(found) == [r for r in range(PODS) if r != 7]
    assert all(found[r].step == r for r in found)
