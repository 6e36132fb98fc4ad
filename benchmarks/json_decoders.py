"""The fast reader's C scanner next to maintained JSON libraries, on the same trace files.

    .venv/bin/python benchmarks/json_decoders.py --lib-python PYTHON [--repeat 5] [FILE ...]

PYTHON: a Python with orjson and msgspec (`python3 -m venv /tmp/jsonlibs &&
/tmp/jsonlibs/bin/pip install orjson msgspec`; not perfdiag's dependencies). Default files: the
two shared HTA traces of benchmarks/kineto_ingest.py. Per file, the lowest CPU time over the
repetitions of:

- `scanner`: perfdiag's fast reader, gzip file → Arrow columns of the complete events
  (`perfdiag.engine.kineto.fast_reader.read_stream`);
- `json.loads`, `orjson.loads`: JSON text → Python objects of the whole document;
- `msgspec typed`: JSON text → msgspec Structs of the fields the reader keeps (ph cat name pid
  tid ts dur and args), other fields skipped by the decoder.

The libraries' figures stop at Python objects: turning them into Arrow columns (what the scanner
returns) costs more on top. The scanner's figure includes the gunzip (ISA-L); the others' do
not (the text is decompressed before the clock).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

from hta_env import SHARED_TRACES

FILES = [
    SHARED_TRACES / "trace_diff" / "control" / "control.json.gz",
    SHARED_TRACES / "trace_diff" / "test" / "test.json.gz",
]

LIBS = """
import gzip, json, sys, time
import msgspec, orjson
from typing import Any, Union
class Event(msgspec.Struct):
    ph: Union[str, None] = None
    cat: Union[str, None] = None
    name: Union[str, None] = None
    pid: Union[int, str, None] = None
    tid: Union[int, str, None] = None
    ts: Union[float, None] = None
    dur: Union[float, None] = None
    args: Union[dict[str, Any], None] = None
class Trace(msgspec.Struct):
    traceEvents: list[Event] = []
typed = msgspec.json.Decoder(Trace)
cases = {"json.loads": json.loads, "orjson.loads": orjson.loads, "msgspec typed": typed.decode}
path, repeat = sys.argv[1], int(sys.argv[2])
out = {}
with gzip.open(path, "rb") as fh:
    text = fh.read()
for label, decode in cases.items():
    best = None
    for _ in range(repeat):
        t = time.process_time()
        doc = decode(text)
        cpu = time.process_time() - t
        del doc
        best = cpu if best is None else min(best, cpu)
    out[label] = best
print(json.dumps(out))
"""


def scanner(path: Path, repeat: int) -> float:
    from perfdiag.engine.kineto.fast_reader import read_stream
    from perfdiag.engine.kineto.parse import COMM_CALL_PREFIXES

    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        found = read_stream(path, COMM_CALL_PREFIXES)
        best = min(best, time.process_time() - t)
        assert found is not None, f"{path}: not read by the fast reader"
        del found
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, default=FILES)
    parser.add_argument("--lib-python", required=True)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for path in args.files:
        libs = json.loads(
            subprocess.run(
                [args.lib_python, "-c", LIBS, str(path), str(args.repeat)],
                capture_output=True,
                text=True,
                check=True,
                cwd="/",
            ).stdout
        )
        ours = scanner(path, args.repeat)
        row = {"scanner": ours, **libs}
        print(
            f"{path.name}: "
            + ", ".join(f"{k} {v:.3f} s ({v / ours:.1f}× the scanner)" for k, v in row.items()),
            flush=True,
        )


if __name__ == "__main__":
    main()
