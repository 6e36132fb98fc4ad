"""Errors a user can act on, raised by the local runner and every `perfdiag` subcommand: the
command prints them without a traceback and exits with their code."""

from __future__ import annotations


class CliError(Exception):
    """An error a user can act on; printed without a traceback."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class CliInterrupted(CliError):
    """The user stopped the run (Ctrl-C, SIGTERM): what was done is said, but it is no error."""
