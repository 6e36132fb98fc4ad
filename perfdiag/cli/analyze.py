"""`perfdiag analyze SOURCE`: (re-)analyze a capture, or a folder of torch.profiler (Kineto)
traces, and print the verdict (docs/cli.md)."""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from perfdiag.analyzer import analyze
from perfdiag.analyzer.errors import AnalyzerError, NoCaptureError
from perfdiag.api.limits import MAX_RANKS
from perfdiag.api.thresholds import Thresholds
from perfdiag.api.validation import validation_problems
from perfdiag.cli import storage_at
from perfdiag.local.errors import CliError, CliInterrupted
from perfdiag.local.progress import Progress
from perfdiag.local.terminal import safe_json, safe_text
from perfdiag.local.verdict_text import render_verdict
from perfdiag.storage import Storage, StorageError

EXIT_NO_CAPTURE = 5
MAX_JOBS = 256


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "analyze",
        help="analyze a capture (or a folder of torch.profiler traces) and print the verdict",
        description="Analyze SOURCE: the output folder of `perfdiag run` (or its s3:// URI), or "
        "a folder of Kineto Chrome-trace files (*.json, *.json.gz) written by torch.profiler. "
        "Writes verdict.json and report.html (into SOURCE unless --out is given).",
        epilog="exit codes: 0 verdict produced, 1 error, 2 usage, 5 SOURCE holds no capture",
    )
    parser.add_argument("source", metavar="SOURCE", help="capture folder, s3:// URI or traces")
    parser.add_argument(
        "--out",
        default=None,
        metavar="URI",
        help="write verdict.json and report.html here instead of into SOURCE",
    )
    parser.add_argument("--json", action="store_true", help="print verdict.json on stdout")
    parser.add_argument(
        "--expected-ranks",
        type=_rank_count,
        default=None,
        metavar="N",
        help="the job had ranks 0..N-1: name the ones missing from the capture",
    )
    parser.add_argument(
        "--thresholds",
        default=None,
        metavar="JSON",
        help="analysis thresholds as a JSON object (the fields of a PerfDiagnosis' "
        "spec.analysis, camelCase or snake_case); unset fields keep their defaults",
    )
    parser.add_argument(
        "--jobs",
        type=_job_count,
        default=1,
        metavar="N",
        help="read N Kineto trace files at a time (default 1): faster where cores are idle, "
        "with the memory of N files",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def _count(what: str, most: int, see: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number of `what` from 1 to `most`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {safe_text(text)!r}") from None
        if not 1 <= value <= most:
            raise argparse.ArgumentTypeError(
                f"{value} is not a number of {what}: give 1 to {most:,}{see}"
            )
        return value

    return parse


_rank_count = _count("ranks", MAX_RANKS, " (docs/limits.md)")
_job_count = _count("jobs", MAX_JOBS)


class _Terminated(Exception):
    """SIGTERM arrived: unwinds the analysis so that its temporary files are removed."""


def _on_sigterm(_signum: int, _frame: object) -> None:
    raise _Terminated


def main(args: argparse.Namespace) -> int:
    # SIGTERM's default action ends the process at once, leaving the temporary folders of the
    # analysis behind; raised as an exception, it unwinds them like Ctrl-C does.
    previous = _install(signal.SIGTERM, _on_sigterm)
    try:
        return _main(args)
    except CliError as exc:
        # Messages name the input (paths, trace contents): printed, they must stay plain text.
        exc.args = (safe_text(str(exc)),)
        raise
    except _Terminated:
        raise CliInterrupted("terminated (SIGTERM)", 143) from None
    finally:
        _install(signal.SIGTERM, previous)


def _install(signum: int, handler: Any) -> Any:
    """signal.signal where it can be called (the main thread), else nothing."""
    if handler is None or threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signum, handler)


def _main(args: argparse.Namespace) -> int:
    source = _open_source(args.source)
    out = storage_at(args.out) if args.out else None
    expected = list(range(args.expected_ranks)) if args.expected_ranks else None
    thresholds = _thresholds(args.thresholds) if args.thresholds else None
    shown = Progress(quiet=args.quiet)

    def progress(message: str) -> None:
        shown(safe_text(message))

    try:
        verdict = analyze(
            source,
            out,
            progress=progress,
            expected_ranks=expected,
            thresholds=thresholds,
            jobs=args.jobs,
        )
    except NoCaptureError as exc:
        raise CliError(f"{args.source} holds no capture: {exc}", EXIT_NO_CAPTURE) from exc
    except AnalyzerError as exc:
        raise CliError(f"cannot analyze {args.source}: {exc}") from exc
    except StorageError as exc:
        hint = "" if args.out else " (use --out to write the verdict elsewhere)"
        raise CliError(f"{exc}{hint}") from exc
    location = (out or source).uri
    if args.json:
        print(safe_json(verdict.to_json()))
    else:
        print(render_verdict(verdict, location=location))
    return 0


def _thresholds(text: str) -> Thresholds:
    try:
        return Thresholds.model_validate_json(text)
    except ValidationError as exc:
        raise CliError(f"--thresholds: {validation_problems(exc, root='thresholds')}", 2) from None


def _open_source(text: str) -> Storage:
    if "://" not in text or text.startswith("file://"):
        path = Path(text.removeprefix("file://")).expanduser()
        if not path.exists():
            raise CliError(f"{text} does not exist")
        if not path.is_dir():
            raise CliError(f"{text} is not a folder (give the capture folder or a traces folder)")
    return storage_at(text)
