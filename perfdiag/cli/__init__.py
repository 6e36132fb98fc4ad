"""The `perfdiag` command. Each subcommand lives in its own module under perfdiag.cli and
is imported only when chosen, so `perfdiag --help` stays fast (torch is never imported here).

Exit codes (documented in docs/cli.md):
  0  done (a verdict was produced, whatever its status)
  1  error: bad input, unreadable or unwritable paths, storage errors (message on stderr)
  2  usage error (argparse)
  3  the training process failed (its exit code and last lines are shown)
  4  the training ended before the capture window completed
  5  SOURCE holds no capture
  6  demo: the verdict does not name the injected fault
  7  the training hung (the hang verdict was printed; perfdiag stopped the training)
  130 interrupted
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence

from perfdiag import __version__
from perfdiag.local.errors import CliError, CliInterrupted
from perfdiag.storage import Storage, StorageError, open_storage

# Modules in perfdiag.cli, each exposing `add_parser(subparsers)`, which adds the command's
# parser, and `main(args)`, which runs it.
COMMANDS: tuple[str, ...] = ("run", "analyze", "demo", "agent", "crd", "operator")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of `only` (the command chosen: the others' modules
    are then not imported, so that a command starts with what it uses alone)."""
    parser = argparse.ArgumentParser(
        prog="perfdiag",
        description="Find out why distributed PyTorch training is slow or stuck.",
    )
    parser.add_argument("--version", action="version", version=f"perfdiag {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMANDS if only is None else (only,):
        module = importlib.import_module(f"perfdiag.cli.{module_name}")
        module.add_parser(sub)
        sub.choices[module_name].set_defaults(handler=module.main)
    return parser


def storage_at(uri: str) -> Storage:
    """The storage at `uri` (perfdiag.storage.open_storage); a bad URI or an unreachable
    store is the command's error (exit code 1)."""
    try:
        return open_storage(uri)
    except StorageError as exc:
        raise CliError(str(exc)) from exc


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    chosen = words[0] if words and words[0] in COMMANDS else None
    if chosen == "analyze":
        # pydantic looks for plugins in every installed package's metadata when it builds its
        # first model (35 ms of a 0.9 s analysis); perfdiag's models use none. Not for `run`:
        # the training it starts inherits the environment.
        os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
        # numpy's OpenBLAS starts a spinning thread per core on import (60 ms of CPU on two
        # cores); the analysis multiplies no matrix large enough to use them.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    parser = build_parser(chosen)
    args = parser.parse_args(argv)
    try:
        result: int = args.handler(args)
        return result
    except CliInterrupted as exc:
        print(f"perfdiag: {exc}", file=sys.stderr)
        return exc.exit_code
    except CliError as exc:
        print(f"perfdiag: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("perfdiag: interrupted", file=sys.stderr)
        return 130


def exit_now(code: int) -> None:
    """Flush and leave without interpreter finalization.

    pyarrow (≤ 26) occasionally aborts while its thread pools are torn down at interpreter exit
    after reading Parquet (apache/arrow#34314, #50482), which would turn a finished diagnosis
    into a SIGABRT. Everything a command writes is closed before it returns, so skipping
    finalization loses nothing."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def entry() -> None:
    """The console script `perfdiag` (in-process callers and tests use `main`)."""
    exit_now(main())
