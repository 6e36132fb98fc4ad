"""`perfdiag run [OPTIONS] -- SCRIPT [ARGS]`: run a torchrun-style training job, capture one
window on all ranks, print the verdict (docs/cli.md)."""

from __future__ import annotations

import argparse
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from perfdiag.api import Verdict
from perfdiag.api.stall import DEFAULT_MAX_S, DEFAULT_MIN_S, DEFAULT_STEP_FACTOR, StallPolicy
from perfdiag.api.trigger import DEFAULT_BASELINE_STEPS, MAX_BASELINE_STEPS, SlowdownRule
from perfdiag.local.errors import CliError
from perfdiag.local.hang import EXIT_HANG
from perfdiag.local.output import Output, default_out, open_output
from perfdiag.local.progress import Progress
from perfdiag.local.runner import LocalRun, run_local
from perfdiag.local.target_check import check_target
from perfdiag.local.torchrun import (
    LaunchTarget,
    add_torchrun_options,
    local_world_size,
    nnodes_max,
    target_from,
    torchrun_argv,
)
from perfdiag.local.verdict_text import render_verdict
from perfdiag.local.window import WindowSettings

DEFAULT_WARMUP_STEPS = 5
DEFAULT_CAPTURE_STEPS = 10
DEFAULT_TIMEOUT_S = 600.0

EPILOG = """\
examples:
  perfdiag run --nproc-per-node 4 --out diag/ -- train.py --lr 0.1
  perfdiag run --nproc-per-node 4 --json -- train.py > verdict.json
  perfdiag analyze diag/

exit codes: 0 verdict produced (whatever its status), 1 error (bad input, output not
writable…), 2 usage, 3 the training failed, 4 the capture window did not complete,
7 the training hung (hang verdict printed, training stopped), 130 interrupted. See docs/cli.md."""


def add_capture_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by `run` and `demo`."""
    group = parser.add_argument_group("perfdiag options")
    group.add_argument(
        "--warmup-steps",
        type=_positive_or_zero,
        default=DEFAULT_WARMUP_STEPS,
        help=f"training steps before the window (default {DEFAULT_WARMUP_STEPS})",
    )
    group.add_argument(
        "--capture-steps",
        type=_positive,
        default=DEFAULT_CAPTURE_STEPS,
        help=f"steps analysed in the window (default {DEFAULT_CAPTURE_STEPS}; "
        "one more is profiled first as warm-up)",
    )
    group.add_argument(
        "--out",
        default=None,
        metavar="URI",
        help="where the capture, verdict.json and report.html go: a folder or s3://bucket/prefix "
        "(default ./perfdiag-<date>-<time>)",
    )
    group.add_argument(
        "--json",
        action="store_true",
        help="print verdict.json on stdout instead of the summary (training stdout goes to stderr)",
    )
    group.add_argument(
        "--python-stacks",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="record Python function calls in the window, to name Python hotspots "
        "(default on; --no-python-stacks lowers the window's overhead)",
    )
    group.add_argument(
        "--keep-raw",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep raw events (events.parquet) next to the summaries (default on)",
    )
    group.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up waiting for the window after this long (default {DEFAULT_TIMEOUT_S:.0f})",
    )
    group.add_argument(
        "--spool",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep the hook's raw spool (Kineto traces) in DIR instead of a temporary folder",
    )
    group.add_argument(
        "--hang-after",
        type=float,
        default=DEFAULT_MIN_S,
        metavar="SECONDS",
        help="a rank whose step has not advanced for max(SECONDS, "
        f"{DEFAULT_STEP_FACTOR:.0f} median steps), at most {DEFAULT_MAX_S:.0f} s, is stuck: "
        "perfdiag dumps every rank's stacks, prints a `hang` verdict, stops the training and "
        f"exits {EXIT_HANG} (default {DEFAULT_MIN_S:.0f}; 0 turns hang detection off)",
    )
    group.add_argument("--quiet", action="store_true", help="no progress lines")
    trigger = parser.add_argument_group("capture on a slowdown")
    trigger.add_argument(
        "--on-slowdown",
        type=_percent,
        default=None,
        metavar="PERCENT",
        help="do not capture after the warm-up: let the training run at full speed and capture "
        "a window on every rank when a rank's mean step over the last --baseline-steps steps "
        "is PERCENT (e.g. 5%%) above its recent best such mean; each capture goes to "
        "OUT/capture-<n>/",
    )
    trigger.add_argument(
        "--baseline-steps",
        type=int,
        default=DEFAULT_BASELINE_STEPS,
        metavar="N",
        help=f"steps per mean for --on-slowdown (default {DEFAULT_BASELINE_STEPS}, "
        f"2–{MAX_BASELINE_STEPS})",
    )
    trigger.add_argument(
        "--max-captures",
        type=_positive,
        default=1,
        metavar="N",
        help="with --on-slowdown: capture up to N windows, one per slowdown; the baseline "
        "starts again after each window (default 1)",
    )
    group.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show the profiler's native log lines (Kineto, CUDA probing) in the terminal "
        "instead of keeping them in perfdiag-native.log in the output folder",
    )


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a training job under torchrun and diagnose it",
        description="Start a torchrun-style training job with the perfdiag hook, capture "
        "--capture-steps steps on every rank after --warmup-steps steps, print the verdict, "
        "and let the training finish.",
        usage="perfdiag run [TORCHRUN OPTIONS] [PERFDIAG OPTIONS] [--] SCRIPT [SCRIPT ARGS]",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_capture_options(parser)
    add_torchrun_options(parser)
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="SCRIPT [ARGS]",
        help="the training script and its arguments (or a module with -m)",
    )


def main(args: argparse.Namespace) -> int:
    target = target_from(args)
    multi_node = nnodes_max(args) > 1
    if multi_node and args.on_slowdown is not None:
        # Each node would fire on its own and capture other steps than the rest.
        raise CliError(
            "--on-slowdown watches one node's ranks; on several nodes use a PerfDiagnosis "
            "with spec.trigger (docs/operator.md)",
            2,
        )
    settings = window_settings(args, local_ranks=local_world_size(args))
    check_target(target, dict(os.environ))  # before the output folder is created
    output = open_output(args.out or default_out(), shared=multi_node)
    run_training(
        args,
        output,
        torchrun_argv(args, target),
        target,
        settings,
        Progress(quiet=args.quiet),
        lambda verdict, where: print_verdict(verdict, args, where),
        multi_node=multi_node,
    )
    return 0


def run_training(
    args: argparse.Namespace,
    output: Output,
    argv: list[str],
    target: LaunchTarget,
    settings: WindowSettings,
    progress: Progress,
    on_verdict: Callable[[Verdict, str], None],
    *,
    multi_node: bool = False,
) -> None:
    """Run the training (`argv`: the torchrun command) to its end with the capture
    `settings`, as the options shared by `run` and `demo` ask, into `output`."""
    run = LocalRun(
        torchrun_argv=argv,
        target=target,
        settings=settings,
        multi_node=multi_node,
        json_output=args.json,
        spool_dir=args.spool,
        verbose=args.verbose,
        created_output=output.created,
    )
    run_local(run, output.storage, progress, on_verdict)


def window_settings(args: argparse.Namespace, *, local_ranks: int) -> WindowSettings:
    _require_torch()
    if args.timeout <= 0:
        raise CliError("--timeout must be positive", 2)
    if args.hang_after < 0:
        raise CliError("--hang-after must be 0 (off) or positive", 2)
    trigger = None
    if args.on_slowdown is not None:
        try:
            trigger = SlowdownRule(percent=args.on_slowdown, baseline_steps=args.baseline_steps)
        except ValidationError as exc:
            raise CliError(
                f"--baseline-steps must be in 2…{MAX_BASELINE_STEPS} and --on-slowdown in "
                f"(0, 1000]% ({exc.errors()[0]['msg']})",
                2,
            ) from None
    return WindowSettings(
        local_ranks=local_ranks,
        trigger=trigger,
        max_captures=args.max_captures,
        warmup_steps=args.warmup_steps,
        capture_steps=args.capture_steps,
        python_stacks=args.python_stacks,
        keep_raw=args.keep_raw,
        timeout_s=args.timeout,
        stall=StallPolicy(min_s=args.hang_after) if args.hang_after > 0 else None,
    )


def print_verdict(verdict: Verdict, args: argparse.Namespace, location: str) -> None:
    if args.json:
        print(verdict.to_json(), flush=True)
    else:
        print("\n" + render_verdict(verdict, location=location) + "\n", flush=True)


def _require_torch() -> None:
    if importlib.util.find_spec("torch") is None:
        raise CliError(
            "torch is not installed in this Python environment; perfdiag runs the training "
            "with the Python it runs on (pip install 'perfdiag[torch]')"
        )


def _percent(text: str) -> float:
    """'5%', '5' or '2.5%' → 5.0 / 2.5."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError("a percentage, e.g. 5%") from None
    if not 0 < value <= 1000:
        raise argparse.ArgumentTypeError("must be above 0% and at most 1000%")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _positive_or_zero(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value
