"""Exceptions the analyzer raises; the CLI maps them to exit codes."""

from __future__ import annotations


class AnalyzerError(Exception):
    """The analysis could not be done; the message says what and where."""


class NoCaptureError(AnalyzerError):
    """The source holds no capture (no plan, no worker files, no Kineto traces)."""


class CaptureError(AnalyzerError):
    """A capture file is unreadable or inconsistent; the message names the key."""
