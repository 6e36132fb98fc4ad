"""The suite's local kubelet (tests/support/perfdiag_testing/kubelet.py): what it writes for a pod's
downward-API volume, and that the kubelet loop refreshing it while the pod's own thread writes
it for the first time cannot fail the pod."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from perfdiag_testing.kubelet import LocalPod, format_map


def _pod(tmp_path: Path) -> LocalPod:
    manifest: dict[str, Any] = {
        "metadata": {"name": "p", "annotations": {"a": "1"}},
        "spec": {
            "volumes": [
                {
                    "name": "podinfo",
                    "downwardAPI": {
                        "items": [
                            {"path": "annotations",
                             "fieldRef": {"fieldPath": "metadata.annotations"}},
                        ]
                    },
                }
            ],
            "containers": [],
        },
    }  # fmt: skip
    pod = LocalPod(SimpleNamespace(workdir=tmp_path), manifest, "127.0.0.2")  # type: ignore[arg-type]
    pod.volumes["podinfo"] = tmp_path / "podinfo"
    pod.volumes["podinfo"].mkdir()
    return pod


def test_concurrent_refreshes_write_whole_files(tmp_path: Path) -> None:
    pod = _pod(tmp_path)
    errors: list[BaseException] = []

    def writer(offset: int) -> None:
        try:
            for i in range(300):
                meta = {"name": "p", "annotations": {"a": str(offset + i % 2)}}
                pod.refresh({"metadata": meta})
        except BaseException as exc:  # collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in (0, 10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    text = (tmp_path / "podinfo" / "annotations").read_text()
    assert text in {format_map({"a": v}) for v in ("0", "1", "10", "11")}
