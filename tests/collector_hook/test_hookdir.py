"""The injectable hook folder: what it holds, that it needs nothing else, sitecustomize chaining,
and that loading it costs nothing until a training step."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from perfdiag.api.plan import Plan
from perfdiag.collector import hookdir

COLLECTOR = Path(hookdir.__file__).resolve().parent

BLOCKED_RUN = textwrap.dedent(
    """
    import sys
    BLOCKED = {"pyarrow", "pydantic", "numpy", "kopf", "kubernetes", "minio", "yaml"}
    attempts = []

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] not in BLOCKED:
                return None
            frame = sys._getframe(1)
            while frame is not None and str(frame.f_globals.get("__name__")).startswith("importlib"):
                frame = frame.f_back
            importer = str(frame.f_globals.get("__name__")) if frame else ""
            attempts.append([name, importer])
            if name.split(".")[0] == "numpy" and importer.startswith(("torch", "numpy")):
                return None  # torch's own dependency, present wherever torch is
            raise ImportError(name + " is blocked in this test")

    sys.meta_path.insert(0, Blocker())
    import site
    site.main()  # what python does at startup without -S: site-packages, then sitecustomize

    import json, torch, perfdiag, perfdiag.collector
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    from perfdiag.collector import hook
    for step in range(40):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        if step == 0:  # wait for the hook to arm, so that the window falls inside the loop
            import time
            deadline = time.monotonic() + 120
            while hook.active_hook().phase != "armed" and time.monotonic() < deadline:
                time.sleep(0.02)
    print(json.dumps({
        "perfdiag": perfdiag.__file__,
        "collector": perfdiag.collector.__file__,
        "attempts": attempts,
        "modules": sorted({m.split(".")[0] for m in sys.modules} & (BLOCKED - {"numpy"})),
    }))
    """
)


def run_python(
    code: str, env: dict[str, str], cwd: Path, *flags: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *flags, "-c", code],
        env=env,
        cwd=cwd,  # not the repository: `-c` puts the cwd on sys.path
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_folder_holds_the_hook_modules_only(tmp_path: Path) -> None:
    dest = hookdir.materialize(tmp_path / "hook")
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    hook_package = sorted(p.name for p in (COLLECTOR / "hook").glob("*.py"))
    assert "spool.py" in hook_package and "__init__.py" in hook_package
    assert files == sorted(
        ["sitecustomize.py", "perfdiag/__init__.py", "perfdiag/collector/__init__.py"]
        + [f"perfdiag/collector/hook/{name}" for name in hook_package]
    )
    sitecustomize = COLLECTOR / "hook" / "sitecustomize.py"
    assert (dest / "sitecustomize.py").read_bytes() == sitecustomize.read_bytes()
    assert hookdir.materialize(dest) == dest  # again, over itself


@pytest.mark.slow
def test_the_hook_runs_with_torch_alone(hooked: Any) -> None:
    hooked.write_plan(Plan.new(plan_id="alone", steps=2))
    done = run_python(BLOCKED_RUN, hooked.env(), hooked.tmp, "-S")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert Path(report["perfdiag"]).is_relative_to(hooked.hook_dir)
    assert Path(report["collector"]).is_relative_to(hooked.hook_dir)
    ours = [a for a in report["attempts"] if str(a[1]).startswith(("perfdiag", "sitecustomize"))]
    assert ours == []
    assert report["modules"] == []
    meta = hooked.hook_meta("alone")
    assert meta is not None and meta["error"] is None, meta
    first = meta["first_step"]  # 1 or 2: the plan was there before the first step
    assert first in (1, 2)
    assert hooked.profiler_steps(hooked.trace_events("alone")) == [first, first + 1, first + 2]


def user_site(tmp_path: Path, body: str) -> Path:
    folder = tmp_path / "user-site"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(body)
    return folder


PROBE = (
    "import json, sys, threading; print(json.dumps({"
    "'sitecustomize': sys.modules['sitecustomize'].__file__,"
    "'hook': 'perfdiag.collector.hook' in sys.modules,"
    "'torch': 'torch' in sys.modules,"
    "'threads': threading.active_count(),"
    "'finders': [type(f).__name__ for f in sys.meta_path]}))"
)


@pytest.mark.parametrize("with_hook_env", [True, False])
def test_the_users_sitecustomize_still_runs(
    hooked: Any, tmp_path: Path, with_hook_env: bool
) -> None:
    mark = tmp_path / "user-site-ran"
    folder = user_site(tmp_path, f"open({str(mark)!r}, 'w').write(__name__)\n")
    env = hooked.env(PYTHONPATH=f"{hooked.hook_dir}:{folder}")
    if not with_hook_env:
        del env["PERFDIAG_SPOOL"], env["PERFDIAG_PLAN"]
    done = run_python(PROBE, env, tmp_path)
    assert done.returncode == 0, done.stderr
    probe = json.loads(done.stdout)
    assert mark.read_text() == "sitecustomize"
    assert probe["sitecustomize"] == str(folder / "sitecustomize.py")
    # Loaded, the hook imports neither torch nor starts a thread before a training step.
    assert probe["hook"] is with_hook_env
    assert probe["torch"] is False and probe["threads"] == 1
    assert ("PostImportFinder" in probe["finders"]) is with_hook_env
    assert not hooked.spool.exists()
    assert done.stderr == ""


def test_errors_of_the_users_sitecustomize_are_reported_as_python_does(
    hooked: Any, tmp_path: Path
) -> None:
    folder = user_site(tmp_path, "raise RuntimeError('user site broken')\n")
    done = run_python(
        "print('still runs')", hooked.env(PYTHONPATH=f"{hooked.hook_dir}:{folder}"), tmp_path
    )
    assert done.returncode == 0 and done.stdout.strip() == "still runs"
    assert "Error in sitecustomize" in done.stderr and "user site broken" in done.stderr
