"""`perfdiag analyze` errors: a SOURCE with no capture, or no SOURCE at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def test_folder_without_capture_exits_5(cli: Any, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a capture")
    code, out, err = cli("analyze", str(tmp_path))
    assert code == 5
    assert f"{tmp_path} holds no capture" in err
    assert out == ""
    assert not (tmp_path / "verdict.json").exists()


def test_missing_source_exits_1(cli: Any, tmp_path: Path) -> None:
    code, _, err = cli("analyze", str(tmp_path / "nothing-here"))
    assert code == 1
    assert "does not exist" in err


def test_file_source_exits_1(cli: Any, tmp_path: Path) -> None:
    (tmp_path / "f.json").write_text("{}")
    code, _, err = cli("analyze", str(tmp_path / "f.json"))
    assert code == 1
    assert "is not a folder" in err
