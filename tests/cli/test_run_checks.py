"""Errors `perfdiag run` reports before it launches anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import perfdiag.local.runner
from perfdiag.local.errors import CliError
from perfdiag.local.output import default_out, prepare_output
from perfdiag.local.target_check import check_target
from perfdiag.local.torchrun import LaunchTarget
from perfdiag.storage import open_storage


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything tries to start the training."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the training was launched")

    monkeypatch.setattr(perfdiag.local.runner, "TrainingProcess", refuse)


def test_script_not_found(cli: Any, tmp_path: Path, no_launch: None) -> None:
    out = tmp_path / "diag"
    code, _, err = cli("run", "--nproc-per-node", "2", "--out", str(out), "--", "nope.py")
    assert code == 1
    assert "training script not found: nope.py" in err
    assert not out.exists()  # nothing was created either


def test_output_not_writable(cli: Any, tmp_path: Path, no_launch: None) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a folder cannot be made under a file, even by root
    code, _, err = cli("run", "--out", str(blocker / "diag"), "--", str(script))
    assert code == 1
    assert "is not writable" in err and str(blocker / "diag") in err


def test_output_holding_a_capture_is_refused(cli: Any, tmp_path: Path, no_launch: None) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    (tmp_path / "diag").mkdir()
    (tmp_path / "diag" / "plan.json").write_text("{}")
    code, _, err = cli("run", "--out", str(tmp_path / "diag"), "--", str(script))
    assert code == 1
    assert "already holds a capture" in err


def test_prepare_output_leaves_no_probe(tmp_path: Path) -> None:
    storage = prepare_output(str(tmp_path / "new" / "diag"), shared=False)
    assert storage.list() == []
    assert (tmp_path / "new" / "diag").is_dir()


def test_shared_output_accepts_other_nodes_files(tmp_path: Path) -> None:
    open_storage(tmp_path).put_text("workers/3/status.json", "{}")
    with pytest.raises(CliError):
        prepare_output(str(tmp_path), shared=False)
    prepare_output(str(tmp_path), shared=True)


def test_default_out_is_new_each_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    first = default_out()
    Path(first).mkdir()
    second = default_out()
    assert first != second and not Path(second).exists()
    assert first.startswith("perfdiag-")


def test_module_and_program_checks(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "train.py").write_text("")
    check_target(LaunchTarget("mypkg.train", (), module=True, no_python=False), env)
    with pytest.raises(CliError, match=r"module not found: mypkg\.nothing"):
        check_target(LaunchTarget("mypkg.nothing", (), module=True, no_python=False), env)
    check_target(LaunchTarget("true", (), module=False, no_python=True), env)
    with pytest.raises(CliError, match="program not found"):
        check_target(LaunchTarget("no-such-program-x", (), module=False, no_python=True), env)
    with pytest.raises(CliError, match="not a file"):
        check_target(LaunchTarget(str(tmp_path), (), module=False, no_python=False), env)


def test_bad_option_values_are_usage_errors(cli: Any, tmp_path: Path) -> None:
    code, _, err = cli("run", "--capture-steps", "0", "--", "t.py")
    assert code == 2 and "--capture-steps" in err
    code, _, err = cli("run", "--timeout", "0", "--out", str(tmp_path), "--", "t.py")
    assert code == 2 and "--timeout" in err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--on-slowdown", "fast"), "a percentage, e.g. 5%"),
        (("--on-slowdown", "0%"), "must be above 0%"),
        (("--on-slowdown", "5%", "--baseline-steps", "1"), "--baseline-steps must be in 2…1000"),
        (("--on-slowdown", "5", "--max-captures", "0"), "must be at least 1"),
    ],
)
def test_slowdown_options_are_checked(
    cli: Any, tmp_path: Path, no_launch: None, options: tuple[str, ...], message: str
) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    code, _, err = cli("run", "--out", str(tmp_path / "diag"), *options, "--", str(script))
    assert code == 2, err
    assert message in err


def test_slowdown_option_reads_a_percentage() -> None:
    from perfdiag.cli.run import _percent

    assert _percent("5%") == 5.0
    assert _percent(" 2.5 ") == 2.5


def test_an_unwritable_spool_is_said_before_launch(
    cli: Any, tmp_path: Path, no_launch: None
) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a folder cannot be made under a file, even by root
    code, _, err = cli(
        "run", "--out", str(tmp_path / "diag"), "--spool", str(blocker / "spool"), "--",
        str(script),
    )  # fmt: skip
    assert code == 1, err
    assert f"the spool {blocker / 'spool'} is not writable" in err


def test_slowdown_trigger_is_for_one_node(cli: Any, tmp_path: Path, no_launch: None) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    code, _, err = cli(
        "run", "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1",
        "--master-port", "29999", "--on-slowdown", "5%", "--out", str(tmp_path / "diag"),
        "--", str(script),
    )  # fmt: skip
    assert code == 2, err
    assert "on several nodes use a PerfDiagnosis with spec.trigger" in err
