"""`perfdiag demo [SCENARIO]`: run the bundled 4-rank CPU training job with an injected fault
and diagnose it; succeed when the diagnosis names the fault (docs/cli.md)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path
from typing import Any

from perfdiag.api import Verdict
from perfdiag.api.thresholds import Thresholds
from perfdiag.api.trigger import SlowdownRule
from perfdiag.cli.run import add_capture_options, print_verdict, run_training, window_settings
from perfdiag.local.demo.scenarios import (
    DEFAULT_FAULT_RANK,
    DEFAULT_RANKS,
    DEFAULT_SCENARIO,
    SCENARIOS,
    TRAIN_SCRIPT,
    Judgement,
    Scenario,
    judge,
)
from perfdiag.local.errors import CliError
from perfdiag.local.output import Output, default_out, open_output
from perfdiag.local.progress import Progress
from perfdiag.local.torchrun import LaunchTarget
from perfdiag.local.window import WindowSettings

EXIT_DIAGNOSIS_MISMATCH = 6


def add_parser(subparsers: Any) -> None:
    listing = "\n".join(f"  {s.name:<18} {s.description}" for s in SCENARIOS.values())
    parser = subparsers.add_parser(
        "demo",
        help="run a bundled 4-rank CPU training job with an injected fault and diagnose it",
        description="Run the bundled data-parallel training job (gloo, CPU) with an injected "
        "fault on one rank, diagnose it like `perfdiag run` does, and check that the verdict "
        "names the fault.",
        epilog=f"scenarios:\n{listing}\n\nexit codes: 0 the diagnosis matches the injected "
        "fault, 6 it does not, others as for `perfdiag run`",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "scenario",
        nargs="?",
        default=DEFAULT_SCENARIO,
        metavar="SCENARIO",
        help=f"one of: {', '.join(SCENARIOS)} (default {DEFAULT_SCENARIO})",
    )
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument(
        "--rank",
        type=int,
        default=DEFAULT_FAULT_RANK,
        help=f"the rank with the fault (default {DEFAULT_FAULT_RANK})",
    )
    parser.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        type=int,
        default=DEFAULT_RANKS,
        dest="nproc",
        help=f"ranks to run (default {DEFAULT_RANKS})",
    )
    parser.add_argument(
        "--train-steps",
        type=int,
        default=None,
        metavar="N",
        help="train at least N steps (the demo also trains at least --train-seconds)",
    )
    parser.add_argument(
        "--train-seconds",
        type=float,
        default=None,
        metavar="S",
        help="train at least S seconds (default: long enough for the window)",
    )
    add_capture_options(parser)


def main(args: argparse.Namespace) -> int:
    if args.list:
        for scenario in SCENARIOS.values():
            print(f"{scenario.name:<18} {scenario.description}")
        return 0
    if args.scenario not in SCENARIOS:
        raise CliError(
            f"unknown scenario {args.scenario!r}; choose one of: {', '.join(SCENARIOS)}", 2
        )
    scenario = SCENARIOS[args.scenario]
    if args.nproc < 2:
        raise CliError("--nproc-per-node: the demo compares ranks, it needs at least 2", 2)
    if not 0 <= args.rank < args.nproc:
        raise CliError(f"--rank {args.rank}: must be between 0 and {args.nproc - 1}", 2)

    settings = window_settings(args, local_ranks=args.nproc)
    if scenario.on_slowdown is not None and settings.trigger is None:
        settings = dataclasses.replace(settings, trigger=SlowdownRule(percent=scenario.on_slowdown))
    output = open_output(args.out or default_out("perfdiag-demo"), shared=False)
    with tempfile.TemporaryDirectory(prefix="perfdiag-demo-") as tmp:
        stop_file = Path(tmp) / "stop"
        script_args = ["--scenario", scenario.name, "--fault-rank", str(args.rank)]
        if args.train_steps is None and args.train_seconds is None:
            # Train until the verdict is out, however fast or loaded this machine is.
            script_args += ["--stop-file", str(stop_file)]
        if args.train_steps is not None:
            script_args += ["--steps", str(args.train_steps)]
        if args.train_seconds is not None:
            script_args += ["--min-seconds", str(args.train_seconds)]
        return _run_demo(args, scenario, settings, output, script_args, stop_file)


def _run_demo(
    args: argparse.Namespace,
    scenario: Scenario,
    settings: WindowSettings,
    output: Output,
    script_args: list[str],
    stop_file: Path,
) -> int:
    storage = output.storage

    target = LaunchTarget(
        entry=str(TRAIN_SCRIPT), args=tuple(script_args), module=False, no_python=False
    )
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(args.nproc),
        target.entry,
        *target.args,
    ]
    fault = "" if scenario.healthy else f" on rank {args.rank}"
    progress = Progress(quiet=args.quiet)
    progress(f"demo scenario {scenario.name}{fault}: {scenario.description}")

    judgements: list[Judgement] = []

    def on_verdict(verdict: Verdict, location: str) -> None:
        print_verdict(verdict, args, location)
        judgement = judge(scenario, verdict, args.rank, Thresholds().report_severity)
        judgements.append(judgement)
        stop_file.touch()
        stream = sys.stderr if args.json else sys.stdout
        word = "matches" if judgement.matches else "DOES NOT match"
        print(f"demo: the diagnosis {word} the scenario: {judgement.explanation}", file=stream)
        stream.flush()

    run_training(args, output, argv, target, settings, progress, on_verdict)
    if judgements and judgements[0].matches:
        return 0
    raise CliError(
        f"demo {scenario.name}: the diagnosis did not match the injected fault "
        f"(verdict in {storage.uri}/verdict.json, report in {storage.uri}/report.html)",
        EXIT_DIAGNOSIS_MISMATCH,
    )
