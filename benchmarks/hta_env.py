"""A Python with Holistic Trace Analysis 0.5.0, for the scripts that hold perfdiag next to HTA
(hta_crosscheck.py, kineto_ingest.py). Not a benchmark: imported by them.

HTA goes into its own virtual environment (by default ~/.cache/perfdiag/hta-0.5.0), never into
the project's: it pins its own pandas/numpy. The one command it runs, if you prefer to make it
yourself:

    python3 -m venv ~/.cache/perfdiag/hta-0.5.0 &&
        ~/.cache/perfdiag/hta-0.5.0/bin/pip install HolisticTraceAnalysis==0.5.0
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

HTA_VERSION = "0.5.0"
DEFAULT_VENV = Path.home() / ".cache" / "perfdiag" / f"hta-{HTA_VERSION}"
SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "hta"


def hta_python(explicit: str | None = None, *, create: bool = True) -> str:
    """The Python to run HTA with: `explicit`, else the default venv (made on first use)."""
    if explicit:
        _check(explicit)
        return explicit
    python = DEFAULT_VENV / "bin" / "python"
    if not python.exists():
        if not create:
            raise SystemExit(f"no HTA environment at {DEFAULT_VENV}: run without --no-install")
        print(f"creating {DEFAULT_VENV} with HolisticTraceAnalysis=={HTA_VERSION} …", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(DEFAULT_VENV)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", f"HolisticTraceAnalysis=={HTA_VERSION}"],
            check=True,
        )
    _check(str(python))
    return str(python)


def _check(python: str) -> None:
    code = "import importlib.metadata as m; print(m.version('HolisticTraceAnalysis'))"
    found = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, check=False
    ).stdout.strip()
    if found != HTA_VERSION:
        sys.exit(
            f"{python} has HolisticTraceAnalysis {found or 'not installed'}, need {HTA_VERSION}"
        )
