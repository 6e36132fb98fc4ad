"""The repository layout of the design card, and its import rules."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPED = {
    "operator": "perfdiag.operator",
    "collector": "perfdiag.collector",
    "analyzer": "perfdiag.analyzer",
}


def _declared_packages() -> set[str]:
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^packages = \[(.*?)^\]", text, re.S | re.M)
    assert block, "pyproject.toml [tool.setuptools] has no packages list"
    return set(re.findall(r'"([\w.]+)"', block.group(1)))


# Namespace packages (no __init__.py): operator/ would otherwise be a regular package named
# `operator` at the repository root, hiding the standard library's module there.
NAMESPACE_PACKAGES = {"perfdiag.operator"}


def _package_folders() -> set[str]:
    found = set(NAMESPACE_PACKAGES)
    for init in ROOT.glob("**/__init__.py"):
        rel = init.parent.relative_to(ROOT)
        top = rel.parts[0]
        if top == "perfdiag":
            found.add(".".join(rel.parts))
        elif top in MAPPED:
            found.add(".".join((MAPPED[top], *rel.parts[1:])))
    return found


def test_every_package_folder_is_declared() -> None:
    assert _package_folders() == _declared_packages()


def test_design_card_folders_exist() -> None:
    for name in (
        "operator",
        "collector",
        "analyzer",
        "charts",
        "crds",
        "tests",
        "benchmarks",
        "docs",
    ):
        assert (ROOT / name).is_dir(), name
    for name in ("Dockerfile", "pyproject.toml", "README.md"):
        assert (ROOT / name).is_file(), name


def test_stdlib_operator_is_not_shadowed_from_the_repository_root() -> None:
    # `python -c` puts the working directory first on sys.path; `operator` is imported at
    # start-up by some interpreters, so it is dropped from sys.modules to be found again.
    code = (
        "import sys; sys.modules.pop('operator', None); import operator; print(operator.__file__);"
        "import perfdiag.operator.handlers as h; print(h.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert not out[0].startswith(str(ROOT)), out
    assert Path(out[1]).resolve() == ROOT / "operator" / "handlers.py"
    assert not (ROOT / "operator" / "__init__.py").exists()


def test_test_support_is_not_part_of_the_installed_package() -> None:
    declared = _declared_packages()
    assert not any("testing" in name for name in declared), declared
    assert not (ROOT / "perfdiag" / "testing").exists()
    assert (ROOT / "tests" / "support" / "perfdiag_testing" / "__init__.py").is_file()


# Which rooms each room may import (docs/design.md §7); `perfdiag` itself (its __version__) is
# open to all.
MAY_IMPORT = {
    "api": set(),
    "storage": set(),
    "engine": {"api", "storage"},
    "collector": {"api", "storage", "engine"},
    "analyzer": {"api", "storage", "engine"},
    "operator": {"api", "storage"},
    "local": {"api", "storage", "engine", "collector", "analyzer"},
    "cli": {"api", "storage", "engine", "collector", "analyzer", "operator", "local"},
}
ANALYZER_STAGES = ("load", "compare", "signals", "findings", "report")


def _sources() -> dict[str, Path]:
    """Installed module name → its file, for every module of the package."""
    found = {}
    for top, package in (("perfdiag", "perfdiag"), *MAPPED.items()):
        for path in (ROOT / top).rglob("*.py"):
            parts = [package, *path.relative_to(ROOT / top).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.startswith("perfdiag.")}


def test_imports_run_one_way_between_rooms() -> None:
    modules = _sources()
    wrong = []
    for module, path in modules.items():
        room = module.split(".")[1] if module.count(".") else None
        if room not in MAY_IMPORT:
            continue
        for name in _imported(path):
            target = name.split(".")[1]
            if name in modules and target != room and target not in MAY_IMPORT[room]:
                wrong.append(f"{module} -> {name}")
    assert not wrong, wrong


def test_analyzer_stages_import_only_earlier_stages() -> None:
    wrong = []
    for module, path in _sources().items():
        parts = module.split(".")
        if len(parts) < 4 or parts[1] != "analyzer" or parts[2] not in ANALYZER_STAGES:
            continue
        own = ANALYZER_STAGES.index(parts[2])
        for name in _imported(path):
            target = name.split(".")
            if target[1] != "analyzer" or len(target) < 3:
                continue
            if (target[2] in ANALYZER_STAGES and ANALYZER_STAGES.index(target[2]) > own) or target[
                2
            ] == "pipeline":
                wrong.append(f"{module} -> {name}")
    assert not wrong, wrong
