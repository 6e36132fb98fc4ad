"""`perfdiag run` accepts torchrun's options and passes them through unchanged."""

from __future__ import annotations

import argparse
import sys

import pytest
from torch.distributed.run import get_args_parser

from perfdiag.cli import build_parser
from perfdiag.local.errors import CliError
from perfdiag.local.torchrun import (
    TORCHRUN_OPTIONS,
    local_world_size,
    nnodes_max,
    target_from,
    torchrun_argv,
)

# torchrun options perfdiag deliberately does not offer: help and shell completion.
_NOT_PASSED = {"-h", "--help", "--print-completion", "--print_completion"}


def _torch_options() -> dict[str, argparse.Action]:
    return {
        flag: action
        for action in get_args_parser()._actions
        for flag in action.option_strings
        if flag not in _NOT_PASSED
    }


def test_every_declared_option_is_a_torchrun_option_of_the_same_shape() -> None:
    torch_options = _torch_options()
    for option in TORCHRUN_OPTIONS:
        for flag in option.flags:
            assert flag in torch_options, flag
            takes_value = torch_options[flag].nargs != 0
            assert takes_value == option.takes_value, flag


def test_every_torchrun_option_is_accepted() -> None:
    declared = {flag for option in TORCHRUN_OPTIONS for flag in option.flags}
    assert set(_torch_options()) == declared


def _run_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", *argv])


def test_script_and_its_arguments_follow_the_double_dash() -> None:
    args = _run_args("--nproc-per-node", "4", "--out", "d", "--", "train.py", "--lr", "0.1")
    target = target_from(args)
    assert (target.entry, target.args) == ("train.py", ("--lr", "0.1"))
    assert args.out == "d"


def test_script_arguments_that_look_like_perfdiag_options_stay_with_the_script() -> None:
    args = _run_args("--nproc_per_node=2", "train.py", "--json", "--out", "x")
    assert target_from(args).args == ("--json", "--out", "x")
    assert not args.json and args.out is None


def test_missing_script_is_a_usage_error() -> None:
    with pytest.raises(CliError) as err:
        target_from(_run_args("--nproc-per-node", "2"))
    assert err.value.exit_code == 2


def test_argv_passes_options_through_and_adds_standalone_for_one_node() -> None:
    args = _run_args("--nproc-per-node", "4", "--max-restarts", "0", "--", "t.py", "--lr", "1")
    argv = torchrun_argv(args, target_from(args))
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert argv[3:] == [
        "--standalone",
        "--nproc-per-node",
        "4",
        "--max-restarts",
        "0",
        "t.py",
        "--lr",
        "1",
    ]
    assert get_args_parser().parse_args(argv[3:]).nproc_per_node == "4"


@pytest.mark.parametrize(
    "options",
    [
        ("--master-port", "29611"),
        ("--rdzv-endpoint", "localhost:29400", "--rdzv-backend", "c10d"),
        ("--standalone",),
        ("--nnodes", "2", "--node-rank", "1"),
    ],
)
def test_no_standalone_when_the_user_chose_a_rendezvous_or_several_nodes(
    options: tuple[str, ...],
) -> None:
    args = _run_args(*options, "t.py")
    argv = torchrun_argv(args, target_from(args))
    assert argv.count("--standalone") == (1 if "--standalone" in options else 0)
    parsed = get_args_parser().parse_args(argv[3:])
    assert parsed.training_script == "t.py"


def test_module_and_no_python_flags_reach_torchrun() -> None:
    args = _run_args("-m", "pkg.train", "--x")
    target = target_from(args)
    assert target.module and not target.no_python
    argv = torchrun_argv(args, target)
    parsed = get_args_parser().parse_args(argv[3:])
    assert parsed.module and parsed.training_script == "pkg.train"
    assert parsed.training_script_args == ["--x"]


def test_rank_counts() -> None:
    assert local_world_size(_run_args("t.py")) == 1
    assert local_world_size(_run_args("--nproc-per-node", "3", "t.py")) == 3
    assert local_world_size(_run_args("--nproc-per-node", "cpu", "t.py")) >= 1
    assert nnodes_max(_run_args("--nnodes", "1:4", "t.py")) == 4
    with pytest.raises(CliError):
        local_world_size(_run_args("--nproc-per-node", "0", "t.py"))
    with pytest.raises(CliError):
        local_world_size(_run_args("--nproc-per-node", "many", "t.py"))
