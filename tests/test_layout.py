"""The repository layout of the design card, and its import rules."""

from __future__ import annotations

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
