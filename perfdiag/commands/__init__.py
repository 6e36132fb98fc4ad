"""Subcommands of the perfdiag CLI, one module each (see perfdiag.cli)."""
