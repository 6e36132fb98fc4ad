"""What can be checked of the Dockerfile without running a container engine: every
path it copies from the build context exists and is not excluded by .dockerignore, the
entrypoint is the CLI console script of pyproject.toml, the hook folder lands where the
webhook's init container copies it from, and the user is the chart's non-root user.
That the image builds and runs is tested by tests/image (buildah on a local Debian base)."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from perfdiag.operator.injection import IMAGE_HOOK_DIR
from tests.chart.chart_support import ROOT, by_kind, objects, render

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _instructions(name: str) -> list[str]:
    text = DOCKERFILE.replace("\\\n", " ")
    return [
        line.split(None, 1)[1]
        for line in text.splitlines()
        if line.strip() and line.split(None, 1)[0].upper() == name
    ]


def _context_copies() -> list[str]:
    sources: list[str] = []
    for args in _instructions("COPY"):
        parts = shlex.split(args)
        if any(p.startswith("--from=") for p in parts):
            continue
        paths = [p for p in parts if not p.startswith("--")]
        sources.extend(paths[:-1])
    return sources


def _ignored(path: str) -> bool:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return any(fnmatch.fnmatch(path, p) or path.split("/")[0] == p for p in patterns)


def test_every_copied_path_exists_in_the_context() -> None:
    sources = _context_copies()
    assert {"pyproject.toml", "perfdiag", "operator", "collector", "analyzer"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), f"Dockerfile copies {source}, which does not exist"
        assert not _ignored(source), f".dockerignore excludes {source}, which the image needs"


PYPROJECT = (ROOT / "pyproject.toml").read_text()  # tomllib is Python >= 3.11 only


def test_the_image_has_every_package_folder_pyproject_installs() -> None:
    """A package folder the wheel needs but the build stage does not copy breaks the image."""
    line = re.search(r"^package-dir = \{(.*)\}$", PYPROJECT, re.M)
    assert line
    roots = {Path(d).parts[0] for d in re.findall(r'= "([^"]+)"', line.group(1))}
    assert roots == {"perfdiag", "operator", "collector", "analyzer"}
    assert roots <= set(_context_copies())


def test_entrypoint_is_the_cli_console_script() -> None:
    [entrypoint] = _instructions("ENTRYPOINT")
    command = json.loads(entrypoint)
    scripts = PYPROJECT.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    target = re.search(rf'^{re.escape(command[0])} = "([\w.]+):(\w+)"$', scripts, re.M)
    assert target, f"ENTRYPOINT {command[0]} is not a console script of pyproject.toml"
    module, function = target.groups()
    imported = __import__(module, fromlist=[function])
    assert callable(getattr(imported, function))


def test_hook_folder_is_where_the_webhook_copies_it_from(tmp_path: Path) -> None:
    copies = [shlex.split(a) for a in _instructions("COPY") if "--from=build" in a]
    destinations = {parts[-1] for parts in copies}
    assert IMAGE_HOOK_DIR in destinations
    # The build stage makes it with perfdiag.collector.hookdir.materialize; do the same here.
    [run] = [r for r in _instructions("RUN") if "materialize" in r]
    assert "from perfdiag.collector.hookdir import materialize" in run
    from perfdiag.collector.hookdir import materialize

    hook = materialize(tmp_path / "hook")
    assert (hook / "sitecustomize.py").is_file()
    assert (hook / "perfdiag" / "collector" / "hook" / "__init__.py").is_file()


@pytest.mark.binaries  # renders the chart with helm
def test_user_is_the_charts_non_root_user() -> None:
    [user] = _instructions("USER")
    uid = int(re.split(r"[:\s]", user.strip())[0])
    assert uid != 0
    [deployment] = by_kind(objects(render("defaults")), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == uid


def test_chart_image_default_matches_the_operator_default() -> None:
    from perfdiag.operator.settings import DEFAULT_IMAGE

    values = yaml.safe_load((ROOT / "charts" / "perfdiag" / "values.yaml").read_text())
    chart = yaml.safe_load((ROOT / "charts" / "perfdiag" / "Chart.yaml").read_text())
    assert f"{values['image']['repository']}:{chart['appVersion']}" == DEFAULT_IMAGE
