"""`python -m perfdiag.cli`: the `perfdiag` command."""

from perfdiag.cli import entry

entry()
