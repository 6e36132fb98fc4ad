"""The profiler's own logging, and warnings about perfdiag's own code, kept out of the terminal.

When the window starts and stops, every rank's profiler (Kineto, in C++) writes lines such as
`USDT:… SyncActivityProfilerHandler.cpp:39] profiler_start` and, on a machine without a GPU,
`ERROR:… DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35` on stderr. They say
nothing about the training, and the user did not ask for a profiler: they go to a log file
(`perfdiag-native.log` in a local output folder) unless `-v` asks for them. So do warnings that
are about perfdiag's hook rather than the training: torch's C++ warnings about the profiler or
naming the hook's code (a multi-line one with all its lines), and Python warnings raised in the
hook's files, by torch's profiler modules, or from the profiler's C++ code (`… (Triggered
internally at …/profiler_python.cpp:…)`; Python attributes those to whatever Python frame was
running, which may be the hook's own thread's), with the source line Python prints under them.
Everything else passes through byte for byte and as soon as it comes, partial lines and `\\r`
progress bars included."""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

# torchrun's `--tee` and torch.distributed put a `[rank0]:` / `[default0]:` tag in front.
_TAG = rb"\[[a-z]+\d+\]:"
_KINETO_LEVELS = (b"V", b"INFO", b"WARNING", b"STAGE", b"ERROR", b"USDT", b"???")
# Kineto's logger: `LEVEL:2024-11-25 01:51:29 1924:1924 File.cpp:39] message`. Nothing but
# Kineto writes this shape, so any such line is the profiler's.
_KINETO = (
    rb"(?:" + b"|".join(re.escape(level) for level in _KINETO_LEVELS) + rb"):"
    rb"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ [\w.+-]+:\d+\] "
)
# c10's logger (torch's C++ code): `[W1125 01:51:31.123456789 file.cpp:12] message` (glog adds
# a thread id; old torch has no time). Anything in torch writes these (gloo, NCCL, the user's
# own extensions), so only the lines about the profiler count as its noise.
_C10 = rb"\[[IWEF](?:\d{3,4} \d\d:\d\d:\d\d\.\d+)?(?: +\d+)? ?[\w/.+-]+:\d+\] "
# Python's warnings module: `/path/file.py:12: UserWarning: message`, then the source line of
# that location indented by two spaces (when Python can read it).
_PY_WARNING = rb"/[^\s:]*\.py:\d+: [A-Z]\w*Warning: "
_HEADER = re.compile(
    rb"(?:" + _TAG + rb")?(?:(?P<kineto>" + _KINETO + rb")|(?P<c10>" + _C10 + rb")|"
    rb"(?P<python>" + _PY_WARNING + rb"))"
)
_ABOUT_THE_PROFILER = re.compile(rb"profil|kineto|cupti|roctracer", re.IGNORECASE)
# perfdiag's own code in a training process: the hook, and `perfdiag.collector.step()`.
_PERFDIAG_CODE = rb"perfdiag/collector/(?:hook/|__init__\.py)"
_ABOUT_PERFDIAG = re.compile(_PERFDIAG_CODE)
# A Python warning is perfdiag's or the profiler's by where it was raised or, for a warning torch
# raised in C++, where in torch.
_PY_WARNING_NOISE = re.compile(
    _PERFDIAG_CODE + rb"|torch/(?:autograd/)?profiler|Triggered internally at [^\n]*"
    rb"(?:profil|kineto|cupti)",
    re.IGNORECASE,
)
# c10 prints a warning as `[W… file.cpp:12] Warning: <message> (function <name>)`: a message
# with newlines ends on the line that ends so.
_C10_WARNING = re.compile(_C10 + rb"Warning: ")
_C10_WARNING_END = re.compile(rb"\(function [^\n]*\)\s*$")
_MAX_WARNING_LINES = 50
_SOURCE_LINE = re.compile(rb"(?:" + _TAG + rb")?  \S")


def _prefixes(atoms: Sequence[bytes]) -> bytes:
    """A pattern for every non-empty beginning of the sequence `atoms` (each one character, or
    a run such as `\\d+` that any shorter run also matches)."""
    pattern = b""
    for atom in reversed(atoms):
        pattern = atom + (b"(?:" + pattern + b")?" if pattern else b"")
    return pattern


_DIGITS, _FILE = rb"\d+", rb"[\w/.+-]+"
_KINETO_REST = [b":", _DIGITS, b"-", _DIGITS, b"-", _DIGITS, b" ", _DIGITS, b":", _DIGITS]
_KINETO_REST += [b":", _DIGITS, b" ", _DIGITS, b":", _DIGITS, b" ", _FILE, b":", _DIGITS]
_KINETO_REST += [rb"\]", b" "]
_C10_TIMED = [rb"\[", b"[IWEF]", _DIGITS, b" ", _DIGITS, b":", _DIGITS, b":", _DIGITS, rb"\."]
_C10_TIMED += [_DIGITS, b" ", rb"[\w/.+ -]+", b":", _DIGITS, rb"\]", b" "]
_C10_UNTIMED = [rb"\[", b"[IWEF]", b" ", _FILE, b":", _DIGITS, rb"\]", b" "]
_HEADER_START = b"|".join(
    [
        *(_prefixes([re.escape(level[i : i + 1]) for i in range(len(level))] + _KINETO_REST)
          for level in _KINETO_LEVELS),
        _prefixes(_C10_TIMED),
        _prefixes(_C10_UNTIMED),
    ]
)  # fmt: skip
# The end of a chunk that may be the beginning of a header cut by the read: held back until
# the next chunk says what it is.
_PARTIAL_HEADER = re.compile(
    rb"(?:" + _prefixes([rb"\[", b"[a-z]+", _DIGITS, rb"\]", b":"]) + rb")"
    rb"|(?:" + _TAG + rb")?(?:" + _HEADER_START + rb")"
)
_FIRST_BYTES = frozenset(b"[" + b"".join(level[:1] for level in _KINETO_LEVELS))
# The beginning of a Python warning, cut by the read: a line that so far reads as a path.
_PARTIAL_PY_WARNING = re.compile(
    rb"(?:"
    + _prefixes([rb"\[", b"[a-z]+", _DIGITS, rb"\]", b":"])
    + rb")?"
    + _prefixes([b"/", rb"[^\s:]*", b":", _DIGITS, b":", b" ", b"[A-Z]", rb"\w*", b":", b" "])
)
# The beginning of a warning's source line, cut by the read.
_SOURCE_LINE_START = re.compile(
    rb"(?:" + _prefixes([rb"\[", b"[a-z]+", _DIGITS, rb"\]", b":"]) + rb")?(?: {0,2})"
)
_LONGEST_HEADER = 200
# A header whose line does not end within this many bytes is not a log line: let it through.
_MAX_HELD = 1 << 16


class NoiseFilter:
    """Splits one stream into what is shown and what goes to the native log.

    Lines (from a header to their newline) of the profiler's logging are routed; a header may
    start mid-line, as when a rank's message lands after another's unfinished progress bar.
    Only a line that began with a header is held until its newline, and the end of a chunk
    only when it may be the start of one: all other output passes through at once. The lines
    that belong to a routed warning (a Python warning's source line, the rest of a multi-line
    c10 warning) follow it."""

    def __init__(self) -> None:
        self._held = b""
        # Kineto writes a message and its newline separately: when two ranks' messages meet on
        # one line, the second's newline comes later as an empty line of its own.
        self._owed_newlines = 0
        # The lines still owed to the warning routed last: ("source", 1) or ("c10", n).
        self._follow: tuple[str, int] | None = None
        self._line_start = True  # what came before ended with a newline

    def feed(self, data: bytes) -> tuple[bytes, bytes]:
        """(bytes to show now, bytes for the native log)."""
        buf = self._held + data
        self._held = b""
        shown, routed = bytearray(), bytearray()

        def show(segment: bytes) -> None:
            if segment:
                shown.extend(segment)
                self._owed_newlines = 0  # the user's output came between: it got that newline

        pos = 0
        while pos < len(buf):
            if self._owed_newlines and buf[pos : pos + 1] == b"\n":
                routed += b"\n"
                self._owed_newlines -= 1
                pos += 1
                continue
            if self._follow is not None:
                taken = self._take_follower(buf, pos)
                if taken is None:  # undecided until more comes
                    self._held = buf[pos:]
                    break
                if taken > pos:
                    routed += buf[pos:taken]
                    pos = taken
                    continue
            match = _HEADER.search(buf, pos)
            if match is None:
                line_start = buf[pos - 1 : pos] == b"\n" if pos else self._line_start
                hold = min(_partial_header_at(buf, pos), _partial_warning_at(buf, pos, line_start))
                show(buf[pos:hold])
                self._held = buf[hold:]
                break
            show(buf[pos : match.start()])
            end = buf.find(b"\n", match.end())
            if end < 0:
                if len(buf) - match.start() > _MAX_HELD:
                    show(buf[match.start() :])
                else:
                    self._held = buf[match.start() :]
                break
            line = buf[match.start() : end + 1]
            if _is_noise(line, match):
                routed += line
                # Owed until the user's output comes between: the other ranks' messages of the
                # same moment often come first.
                self._owed_newlines += len(_HEADER.findall(line)) - 1
                self._follow = _followers(line, match)
            else:
                show(line)
            pos = end + 1
        consumed = len(buf) - len(self._held)
        if consumed:
            self._line_start = buf[consumed - 1 : consumed] == b"\n"
        return bytes(shown), bytes(routed)

    def _take_follower(self, buf: bytes, pos: int) -> int | None:
        """Where the line at `pos` ends when it belongs to the warning routed before it (pos
        when it does not: the warning is over), or None when that cannot be told yet."""
        assert self._follow is not None
        kind, left = self._follow
        end = buf.find(b"\n", pos)
        line = buf[pos : end + 1] if end >= 0 else buf[pos:]
        if kind == "source":
            belongs = _SOURCE_LINE.match(line) is not None
            if not belongs and end < 0 and _SOURCE_LINE_START.fullmatch(line):
                return None
        else:
            belongs = _HEADER.match(line) is None
        if belongs and end < 0:
            if len(line) <= _MAX_HELD:
                return None
            belongs = False
        if not belongs:
            self._follow = None
            return pos
        last = kind == "source" or left <= 1 or _C10_WARNING_END.search(line) is not None
        self._follow = None if last else (kind, left - 1)
        return end + 1

    def finish(self) -> tuple[bytes, bytes]:
        """At the end of the stream: what was held, shown or logged."""
        held, self._held = self._held, b""
        follow, self._follow = self._follow, None
        if follow is not None and held and _HEADER.match(held) is None:
            source = follow[0] == "source" and _SOURCE_LINE.match(held) is not None
            if source or follow[0] == "c10":
                return b"", held
        match = _HEADER.match(held)
        if match is not None and _is_noise(held, match):
            return b"", held
        return held, b""


def _is_noise(line: bytes, header: re.Match[bytes]) -> bool:
    if header.group("kineto") is not None:
        return True
    # A log message has no \r: what follows one is a progress bar that came between.
    text = line.split(b"\r", 1)[0]
    if header.group("python") is not None:
        return _PY_WARNING_NOISE.search(text) is not None
    return _ABOUT_THE_PROFILER.search(text) is not None or _ABOUT_PERFDIAG.search(text) is not None


def _followers(line: bytes, header: re.Match[bytes]) -> tuple[str, int] | None:
    """What follows a routed line as part of it: a Python warning's source line, or the rest
    of a c10 warning whose message has newlines."""
    if header.group("python") is not None:
        return ("source", 1)
    if header.group("c10") is None:
        return None
    start = header.start("c10") - header.start()  # `line` begins where the header does
    if _C10_WARNING.match(line, start) and not _C10_WARNING_END.search(line):
        return ("c10", _MAX_WARNING_LINES)
    return None


def _partial_header_at(buf: bytes, pos: int) -> int:
    """Where in buf[pos:] a header may begin that runs past its end (len(buf) if nowhere)."""
    for start in range(max(pos, len(buf) - _LONGEST_HEADER), len(buf)):
        if buf[start] in _FIRST_BYTES and _PARTIAL_HEADER.fullmatch(buf, start):
            return start
    return len(buf)


def _partial_warning_at(buf: bytes, pos: int, line_start: bool) -> int:
    """Where in buf[pos:] the beginning of a Python warning runs past its end (len(buf) if
    nowhere): Python writes a warning at the start of a line."""
    newline = buf.rfind(b"\n", pos)
    start = newline + 1 if newline >= 0 else (pos if line_start else len(buf))
    if start < len(buf) and _PARTIAL_PY_WARNING.fullmatch(buf, start):
        return start
    return len(buf)


NATIVE_LOG_HINT = "-v prints it in the terminal"


class NativeLog:
    """Where routed lines go: a file, created on the first line (no noise, no file), or
    nowhere (`path` None: the output is not a local folder). Shared by the output pumps."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.lines = 0
        self._file: BinaryIO | None = None
        self._lock = threading.Lock()
        self._failed = False
        self._closed = False

    def write(self, data: bytes) -> None:
        if not data:
            return
        with self._lock:
            self.lines += data.count(b"\n")
            if self.path is None or self._failed or self._closed:
                return
            try:
                if self._file is None:
                    self._file = self.path.open("wb")
                self._file.write(data)
                self._file.flush()
            except (OSError, ValueError):
                self._failed = True  # the log is a courtesy: never stop the training for it

    @property
    def written(self) -> Path | None:
        """The file holding the lines, once there is one."""
        with self._lock:
            return self.path if self._file is not None and not self._failed else None

    def close(self) -> None:
        """No more lines are written (a pump still draining a child that outlived its stop
        only counts them)."""
        with self._lock:
            self._closed = True
            if self._file is not None:
                self._file.close()

    def where(self) -> str:
        """For a message: where the routed lines are."""
        written = self.written
        lines = f"{self.lines} line{'s' if self.lines != 1 else ''}"
        if written is not None:
            return f"the profiler's native log ({lines}) is in {written}; {NATIVE_LOG_HINT}"
        return (
            f"the profiler's native log ({lines}) was not kept (the output is not a local "
            f"folder); {NATIVE_LOG_HINT}"
        )
