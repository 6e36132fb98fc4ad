"""The suite's local kubelet (tests/support/perfdiag_testing/kubelet.py): what it writes for a pod's
downward-API volume (the whole annotations map in the kubelet's `key="value"` format, one
annotation as its raw value), and that the kubelet loop refreshing it while the pod's own thread
writes it for the first time cannot fail the pod."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from perfdiag_testing.kubelet import LocalPod, format_map


def _pod(tmp_path: Path, annotations: dict[str, str] | None = None) -> LocalPod:
    notes = {"a": "1"} if annotations is None else annotations
    manifest: dict[str, Any] = {
        "metadata": {"name": "p", "annotations": notes},
        "spec": {
            "volumes": [
                {
                    "name": "podinfo",
                    "downwardAPI": {
                        "items": [
                            {"path": "annotations",
                             "fieldRef": {"fieldPath": "metadata.annotations"}},
                            {"path": "plan",
                             "fieldRef": {"fieldPath": "metadata.annotations['perfdiag.io/plan']"}},
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


def test_one_annotation_is_its_raw_value_and_empty_when_absent(tmp_path: Path) -> None:
    """As Kubernetes' fieldpath.ExtractFieldPathAsString for metadata.annotations['key']: the
    value unquoted and unescaped, "" for an absent key; rewritten when it changes."""
    plan = tmp_path / "podinfo" / "plan"
    pod = _pod(tmp_path, annotations={})
    pod.refresh({"metadata": {"name": "p"}})
    assert plan.read_bytes() == b""
    value = '{"id": "a\\"b", "note": "é\\n"}\nsecond line\t"quoted"'
    pod.refresh({"metadata": {"name": "p", "annotations": {"perfdiag.io/plan": value, "x": "y"}}})
    assert plan.read_bytes() == value.encode()
    assert (tmp_path / "podinfo" / "annotations").read_text() == format_map(
        {"perfdiag.io/plan": value, "x": "y"}
    )
    pod.refresh({"metadata": {"name": "p", "annotations": {"x": "y"}}})
    assert plan.read_bytes() == b""
