"""An install without a C compiler: setup.py still succeeds without the scanner extension, and
perfdiag then reads traces with the general reader — the same tables — saying so once.

The missing extension is simulated in a fresh Python whose import of perfdiag.engine.kineto._scan fails
(a sys.meta_path finder), as it fails where the extension was never built."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perfdiag.engine.kineto import read_kineto
from perfdiag.engine.kineto._scan import Squeezer as CSqueezer
from perfdiag.engine.kineto._scan import prune as c_prune
from perfdiag.engine.kineto.native import NOT_BUILT
from perfdiag.engine.kineto.scan_python import Squeezer as PySqueezer
from perfdiag.engine.kineto.scan_python import prune as py_prune
from perfdiag_testing.synthetic_trace import TraceJob

ROOT = Path(__file__).resolve().parents[2]

BLOCK = """
import sys
class _NoScanner:
    def find_spec(self, name, path=None, target=None):
        if name == "perfdiag.engine.kineto._scan":
            raise ImportError("perfdiag.engine.kineto._scan is not built")
        return None
sys.meta_path.insert(0, _NoScanner())
"""

READ = """
import json, sys
from pathlib import Path
from perfdiag.engine.kineto import native, read_kineto
rows = []
for name in sys.argv[1:]:
    events, meta = read_kineto(Path(name))
    rows.append({"rows": events.num_rows, "rank": meta.rank, "events": events.to_pydict()})
print(json.dumps({"built": native.BUILT, "reads": rows}, default=str))
"""


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd="/",  # not the repository: its folders would shadow installed modules
        check=True,
        timeout=300,
    )


def test_without_the_scanner_the_general_reader_reads_the_same_and_says_so_once(
    tmp_path: Path,
) -> None:
    paths = TraceJob(n_ranks=2, n_steps=3).write(tmp_path)
    done = _run(BLOCK + READ, *map(str, paths))
    found = json.loads(done.stdout)
    assert found["built"] is False
    # One line, for two traces read.
    assert done.stderr.splitlines() == [NOT_BUILT], done.stderr
    for path, read in zip(paths, found["reads"], strict=True):
        events, meta = read_kineto(path)  # here: the C scanner
        assert read["rank"] == meta.rank and read["rows"] == events.num_rows
        assert read["events"] == json.loads(json.dumps(events.to_pydict(), default=str))


def test_with_the_scanner_nothing_is_said(tmp_path: Path) -> None:
    paths = TraceJob(n_ranks=1, n_steps=2).write(tmp_path)
    done = _run(READ, *map(str, paths))
    assert json.loads(done.stdout)["built"] is True
    assert done.stderr == ""


def _squeezed(squeezer: object, pieces: list[bytes], upto: int) -> tuple[object, ...]:
    out = bytearray()
    consumed = [squeezer.squeeze(piece, out, upto) for piece in pieces]  # type: ignore[attr-defined]
    state = ("stopped", "read", "kept", "string_at", "string_kept")
    return bytes(out), consumed, *(getattr(squeezer, name) for name in state)


@pytest.mark.parametrize("seed", range(150))
def test_the_python_squeezer_is_the_c_one(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = b' \t\n\r"\\{}[],:0123456789.eE-truefalsnul\x00\x01x\xc3\xa9'
    text = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 400)))
    if seed % 3 == 0:  # JSON with padding, escapes and blanks inside strings
        words = ["  a  b ", 'q"uote', "back\\slash\\", "é", '\\"', ""]
        doc = {"traceEvents": [{"name": rng.choice(words), "ts": i / 3} for i in range(9)]}
        indent = rng.randint(0, 8)
        text = json.dumps(doc, indent=indent, ensure_ascii=rng.random() < 0.5).encode()
    cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 5))))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    limit = rng.choice([0, 3, 10, 1 << 20])
    upto = rng.choice([-1, -1, rng.randint(0, 300)])
    assert _squeezed(PySqueezer(limit), pieces, upto) == _squeezed(CSqueezer(limit), pieces, upto)


@pytest.mark.parametrize(
    "text", [b"[]", b'{"a": [[[1]]]}', b"[" * 513 + b"]" * 513, b"[" * 512 + b"]" * 512,
             b'["' + b"[" * 600 + b'"]', b"not json"],
)  # fmt: skip
def test_the_python_prune_refuses_the_same_depth(text: bytes) -> None:
    c_status = c_prune(bytearray(text))[0]
    assert py_prune(bytearray(text))[0] == (2 if c_status == 2 else 0)


def test_setup_succeeds_without_a_c_compiler(tmp_path: Path) -> None:
    """setup.py build_ext with a compiler that fails (as a missing one does): the build goes
    on, no extension is made, setuptools says why."""
    source = tmp_path / "src"
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name if source.exists() else _mkdir(source) / name)
    (source / "perfdiag" / "engine" / "kineto").mkdir(parents=True)
    shutil.copy(ROOT / "perfdiag/engine/kineto/_scan.c", source / "perfdiag/engine/kineto/_scan.c")
    env = {**os.environ, "CC": "/bin/false", "LDSHARED": "/bin/false"}
    done = subprocess.run(
        [sys.executable, "-c", "from setuptools import setup; import runpy; "
         "runpy.run_path('setup.py', run_name='__main__')",
         "build_ext", "--build-lib", str(tmp_path / "lib"), "--build-temp", str(tmp_path / "t")],
        cwd=source, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert not list((tmp_path / "lib").rglob("_scan*.so"))
    assert "_scan" in done.stdout + done.stderr and "failed" in (done.stdout + done.stderr)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path
