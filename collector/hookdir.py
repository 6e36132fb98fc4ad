"""The injectable hook folder: the smallest importable tree that runs the hook.

`materialize(dest)` writes `sitecustomize.py` and the `perfdiag` package files the hook
imports (standard library and torch only) into `dest`. Putting `dest` first on PYTHONPATH of a
training process loads the hook there with no code change: `perfdiag run` does it for local
ranks, the Docker image carries it at /opt/perfdiag/hook for the webhook to inject.
"""

from __future__ import annotations

import os
from pathlib import Path

import perfdiag

COLLECTOR = Path(__file__).resolve().parent
# The hook is one package, copied whole; tests/collector_hook/test_hookdir.py checks nothing
# else is needed (it runs the hook from the folder with every other package import blocked).
HOOK = COLLECTOR / "hook"


def hook_files() -> dict[str, Path]:
    """Relative path in the hook folder → source file."""
    files = {
        "sitecustomize.py": HOOK / "sitecustomize.py",
        "perfdiag/__init__.py": Path(perfdiag.__file__).resolve(),
        "perfdiag/collector/__init__.py": COLLECTOR / "__init__.py",
    }
    for source in sorted(HOOK.glob("*.py")):
        files[f"perfdiag/collector/hook/{source.name}"] = source
    return files


def materialize(dest: Path) -> Path:
    """Write the hook folder into `dest` (created if needed; files replaced atomically)."""
    for relative, source in hook_files().items():
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_bytes(source.read_bytes())
        os.replace(tmp, target)
    return dest
