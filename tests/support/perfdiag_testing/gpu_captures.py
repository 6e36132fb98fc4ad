"""GPU fault captures: what `scripts/gpu-check.sh` brings back from a GPU machine, and how those
captures become test data.

On the GPU machine (gpu-check.sh calls these; standard library only, any python3):

    gpu_captures.py record OUT --scenario S --repeat N --rc RC --seconds T \\
        --expectations EXPECTATIONS.json      # run.json + expected.json into OUT, one line out
    gpu_captures.py pack --runs RUNS --logs LOGS --dest DEST [--traces SPOOL]
                                              # DEST/captures-<k>.tar.gz (+ traces.tar.gz)

Here, with the archives that came back (`captures-*.tar.gz`), from the repository root:

    .venv/bin/python tests/support/perfdiag_testing/gpu_captures.py import \\
        tests/data/gpu-captures /path/to/captures-*.tar.gz

which unpacks each run's capture (plan.json, workers/<rank>/{summary,hardware,status}, events
where packed, the verdict `perfdiag run` printed as verdict.json, run.json) into
tests/data/gpu-captures/<scenario>-<repeat>/ and writes expected.json there, derived anew
from the scenario's documented expectation (`expected_verdict()` of
benchmarks/gpu_transformer_train.py, for the number of GPUs the run had). A run that produced
no capture (its exit code is in run.json and summary.txt) is not imported. The suite judges each
folder again with `perfdiag analyze <folder>` and `judge(expected, verdict)`.

expected.json: `status` (healthy | degraded), `culprits` (ranks to be named, every one and
nobody else), `categories` (what a culprit's finding may blame), `functions` (substrings of
which a culprit's findings' function, or a frame of the user's code on the path to it, must
contain one; empty: any), plus the scenario and the GPU count it was derived for. A run whose
fault cost its rank less than the reporting threshold on the machine it ran on is relabelled
healthy with the measurement that says so (`gpu_captures.py immaterial RUN... --why TEXT`;
the scenario's verdict kept as `injected`): a difference below materiality must not alarm.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import io
import json
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
TRAIN_SCRIPT = ROOT / "benchmarks" / "gpu_transformer_train.py"
CULPRIT_KINDS = frozenset({"slow_worker", "hardware", "function_anomaly", "slow_node"})
# What comes back from the machine: at most 8 files of 16 MiB each, summary.txt among them.
PART_BYTES = 15_000_000
MAX_FILES = 8
EVENTS_MAX_BYTES = 6_000_000  # events.parquet beyond this (per rank) stays behind
LOG_TAIL_BYTES = 256 * 1024
RUN_FILES = ("run.json", "expected.json", "plan.json", "verdict.json", "perfdiag-native.log")
WORKER_CORE = ("summary.parquet", "status.json")
TRACE_NAMES = ("trace.json", "hook.json")


# -- judging ---------------------------------------------------------------------------------


def judge(expected: dict[str, Any], verdict: dict[str, Any]) -> tuple[bool, str]:
    """Does the verdict say what the scenario injected: every culprit named with an allowed
    category (and function), nobody else; for no culprit, status healthy and no finding?"""
    findings: list[dict[str, Any]] = list(verdict.get("findings") or [])
    status = verdict.get("status")
    named = sorted({r for f in findings if f.get("kind") in CULPRIT_KINDS for r in f["ranks"]})
    culprits = sorted(expected["culprits"])
    if not culprits:
        if status == "healthy" and not findings:
            return True, "healthy, nothing reported"
        first = findings[0] if findings else None
        what = f"{first['kind']} {first['category']} ranks {first['ranks']}" if first else ""
        return False, f"false alarm: {status} {what}".rstrip()
    if named != culprits:
        return False, f"named {named}, expected {culprits}"
    for rank in culprits:
        mine = [f for f in findings if f.get("kind") in CULPRIT_KINDS and rank in f["ranks"]]
        if mine[0]["category"] not in expected["categories"]:
            return False, (
                f"rank {rank}: {mine[0]['category']}, expected one of {expected['categories']}"
            )
        wanted = expected.get("functions") or []
        # The function a finding names, or a frame of the user's code it names on the way
        # there (evidence.workers[].user_path: `__getitem__ → decode → tokenize`).
        functions = [str(f.get("function") or "") for f in mine] + [
            frame
            for f in mine
            for worker in (f.get("evidence") or {}).get("workers") or []
            for frame in worker.get("user_path") or []
        ]
        if wanted and not any(w in fn for w in wanted for fn in functions):
            return False, f"rank {rank}: function {functions[0][:60]!r}, expected {wanted}"
    return True, "every culprit named with its cause"


def top_finding(verdict: dict[str, Any]) -> str:
    findings = verdict.get("findings") or []
    if not findings:
        return "-"
    f = findings[0]
    function = str(f.get("function") or "-")[:90]
    return f"{f['kind']} ranks {f['ranks']} {f['category']} {function} ({f['severity']:.0%})"


# -- record: one run's facts next to its capture -----------------------------------------------


def record(
    out: Path,
    *,
    scenario: str,
    repeat: int,
    rc: int,
    seconds: float,
    expectations: Path | None,
    facts: dict[str, Any],
    log: Path | None = None,
) -> str:
    """Write run.json (and expected.json when the scenario has an expectation) into `out`;
    return the run's summary line."""
    out.mkdir(parents=True, exist_ok=True)
    expected = None
    if expectations is not None and expectations.is_file():
        table = {e["scenario"]: e for e in json.loads(expectations.read_text())}
        expected = table.get(scenario)
    run = {"scenario": scenario, "repeat": repeat, "rc": rc, "seconds": round(seconds, 1)}
    run.update(facts)
    (out / "run.json").write_text(json.dumps(run, indent=1) + "\n")
    if expected is not None:
        (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    head = f"{scenario} #{repeat}: exit {rc}, {seconds:.0f} s"
    try:
        verdict = json.loads((out / "verdict.json").read_text())
    except (OSError, ValueError):
        return f"{head}, no verdict{_last_line(log)}"
    line = f"{head}, {verdict.get('status')}; top: {top_finding(verdict)}"
    if expected is None:
        return f"{line}; no expectation"
    right, why = judge(expected, verdict)
    # A dry run without a GPU injects the CPU stand-ins of the faults: its lines test the
    # script, not the diagnosis.
    dry = " (no GPU: a dry run)" if not facts.get("gpus") else ""
    return f"{line}; {'RIGHT' if right else 'WRONG'}{dry}: {why}"


def _last_line(log: Path | None) -> str:
    """The log's last line (how the run ended), for a run without a verdict."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines()] if log else []
    except OSError:
        return ""
    lines = [ln for ln in lines if ln]
    return f": {lines[-1][:160]}" if lines else ""


# -- pack: the captures into a few archives --------------------------------------------------


@dataclass(frozen=True)
class Item:
    arcname: str
    path: Path
    size: int
    """Bytes packed: the file's, or its last LOG_TAIL_BYTES for a longer log."""


def _items(paths: list[Path], base: Path, prefix: str, *, tail: bool = False) -> list[Item]:
    return [
        Item(
            f"{prefix}/{p.relative_to(base).as_posix()}",
            p,
            min(p.stat().st_size, LOG_TAIL_BYTES) if tail else p.stat().st_size,
        )
        for p in paths
        if p.is_file()
    ]


def _add(tar: tarfile.TarFile, item: Item) -> None:
    if item.size == item.path.stat().st_size:
        tar.add(item.path, arcname=item.arcname)
        return
    # A log that ran away (a warning per step): its end says how the run ended.
    with item.path.open("rb") as source:
        source.seek(-item.size, io.SEEK_END)
        data = source.read(item.size)
    info = tarfile.TarInfo(item.arcname)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _run_dirs(runs: Path) -> list[Path]:
    """Run folders in the order they ran (run.json's `order`, else by name)."""

    def order(path: Path) -> tuple[int, str]:
        try:
            return int(json.loads((path / "run.json").read_text()).get("order", 0)), path.name
        except (OSError, ValueError):
            return 0, path.name

    return sorted((p for p in runs.iterdir() if p.is_dir()), key=order) if runs.is_dir() else []


def _repeat(run: Path) -> int:
    try:
        return int(json.loads((run / "run.json").read_text()).get("repeat", 1))
    except (OSError, ValueError):
        return 1


def pack(
    runs: Path,
    dest: Path,
    *,
    logs: Path | None = None,
    traces: Path | None = None,
    part_bytes: int = PART_BYTES,
    max_files: int = MAX_FILES,
    events_max: int = EVENTS_MAX_BYTES,
) -> list[str]:
    """Pack every run's capture into dest/captures-<k>.tar.gz, each at most `part_bytes`, and
    the spooled raw traces into dest/traces.tar.gz; summary.txt counts as one of `max_files`.
    Most needed first: logs and each run's verdict, plan and summaries; then the hardware
    samples; then events.parquet, the first repeat of each scenario before the others, a run
    only with both ranks. Returns what was left behind and why."""
    dest.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    trace_archive = _pack_traces(traces, dest / "traces.tar.gz", part_bytes, notes)
    max_parts = max_files - 1 - (1 if trace_archive else 0)
    run_dirs = _run_dirs(runs)
    tiers: list[list[list[Item]]] = [[], [], [], []]
    if logs is not None and logs.is_dir():
        tiers[0].append(_items(sorted(logs.rglob("*")), logs, "logs", tail=True))
    for run in run_dirs:
        prefix = f"runs/{run.name}"
        workers = sorted((run / "workers").glob("*"))
        core = [run / name for name in RUN_FILES]
        core += [w / name for w in workers for name in WORKER_CORE]
        tiers[0].append(_items(core, run, prefix))
        tiers[1].append(_items([w / "hardware.parquet" for w in workers], run, prefix))
        events = _items([w / "events.parquet" for w in workers], run, prefix)
        if any(e.size > events_max for e in events):
            notes.append(f"{run.name}: events.parquet over {events_max / 1e6:.0f} MB, left out")
        elif events:
            tiers[2 if _repeat(run) == 1 else 3].append(events)
    parts = _Parts(max_parts, part_bytes)
    for tier, groups in enumerate(tiers):
        for group in groups:
            if group and not parts.place(group):
                what = ("logs and capture", "hardware", "events", "events")[tier]
                notes.append(f"{group[0].arcname.split('/')[1]}: {what} left out (no room)")
    for k, part in enumerate(parts.items, 1):
        with tarfile.open(dest / f"captures-{k}.tar.gz", "w:gz") as tar:
            for item in part:
                _add(tar, item)
    return notes


class _Parts:
    """Archives being filled: each item goes into the first with room (first fit), a group
    of items all or none."""

    def __init__(self, count: int, part_bytes: int) -> None:
        self.count = count
        # Tar header and padding per file; gzip never grows parquet by more than 1%.
        self.capacity = part_bytes * 0.97
        self.items: list[list[Item]] = []
        self.rooms: list[float] = []

    @staticmethod
    def cost(item: Item) -> float:
        return item.size * 1.01 + 1024

    def place(self, group: list[Item]) -> bool:
        placed: list[int] = []
        for item in group:
            cost = self.cost(item)
            index = next((k for k, room in enumerate(self.rooms) if room >= cost), None)
            if index is None and len(self.rooms) < self.count and cost <= self.capacity:
                self.items.append([])
                self.rooms.append(self.capacity)
                index = len(self.rooms) - 1
            if index is None:
                for k, done in zip(placed, group[: len(placed)], strict=True):
                    self.items[k].remove(done)
                    self.rooms[k] += self.cost(done)
                while self.items and not self.items[-1]:
                    self.items.pop()
                    self.rooms.pop()
                return False
            self.items[index].append(item)
            self.rooms[index] -= cost
            placed.append(index)
        return True


def _pack_traces(spool: Path | None, archive: Path, limit: int, notes: list[str]) -> bool:
    """Raw Kineto traces of the spooled runs, each gzipped, while the archive stays in bounds
    (a gzipped trace does not shrink again in the archive)."""
    if spool is None or not spool.is_dir():
        return False
    files = sorted(p for p in spool.rglob("*") if p.is_file() and p.name in TRACE_NAMES)
    if not files:
        return False
    used = 0
    with tarfile.open(archive, "w") as tar, tempfile.TemporaryDirectory() as tmp:
        for path in files:
            packed = Path(tmp) / (path.name + ".gz")
            with path.open("rb") as source, gzip.open(packed, "wb", compresslevel=6) as sink:
                shutil.copyfileobj(source, sink)
            size = packed.stat().st_size + 1024
            if used + size > limit * 0.97:
                notes.append(f"traces: {path.relative_to(spool)} left out (no room)")
                continue
            tar.add(packed, arcname=f"traces/{path.relative_to(spool).as_posix()}.gz")
            used += size
    return True


# -- import: archives → tests/data/gpu-captures ------------------------------------------------


def expectations(gpus: int, fault_rank: int) -> dict[str, dict[str, Any]]:
    """Every scenario's expected verdict, from the training script's documented table."""
    name = "gpu_transformer_train"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, TRAIN_SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up while it loads
        spec.loader.exec_module(module)
    return {
        scenario: module.expected_verdict(scenario, fault_rank=fault_rank, gpus=gpus)
        for scenario in module.SCENARIOS
    }


def import_archives(
    archives: list[Path], dest: Path, *, force: bool = False, repeat_offset: int = 0
) -> list[str]:
    """Unpack the runs of the archives into dest/<scenario>-<repeat>/ with a fresh
    expected.json each; returns one line per run. `repeat_offset`: added to each run's repeat
    (a second device call's runs after the first's)."""
    lines: list[str] = []
    tables: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp)
        for archive in archives:
            with tarfile.open(archive) as tar:
                for member in tar.getmembers():
                    inside = Path(member.name)
                    if inside.is_absolute() or ".." in inside.parts or not member.isfile():
                        raise ValueError(f"{archive}: unexpected member {member.name}")
                tar.extractall(staging, filter="data")
        for run in sorted((staging / "runs").glob("*")):
            facts = json.loads((run / "run.json").read_text())
            if repeat_offset:
                facts["repeat"] = int(facts["repeat"]) + repeat_offset
                (run / "run.json").write_text(json.dumps(facts, indent=1) + "\n")
            name = f"{facts['scenario']}-{facts['repeat']}"
            if not (run / "plan.json").is_file() or not list(run.glob("workers/*/summary*")):
                lines.append(f"{name}: no capture (exit {facts.get('rc')}), not imported")
                continue
            key = (int(facts.get("gpus", 1)), int(facts.get("fault_rank", 1)))
            if key not in tables:
                tables[key] = expectations(*key)
            expected = tables[key].get(facts["scenario"])
            if expected is None:
                lines.append(f"{name}: no documented expectation, not imported")
                continue
            target = dest / name
            if target.exists():
                if not force:
                    lines.append(f"{name}: {target} exists, kept (--force replaces it)")
                    continue
                shutil.rmtree(target)
            shutil.copytree(run, target, ignore=shutil.ignore_patterns("expected.json"))
            (target / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
            try:
                verdict = json.loads((target / "verdict.json").read_text())
            except (OSError, ValueError):
                lines.append(f"{name}: imported (no verdict was written on the machine)")
                continue
            right, why = judge(expected, verdict)
            lines.append(f"{name}: imported; its verdict there: {'right' if right else why}")
    return lines


def mark_immaterial(run: Path, why: str) -> str:
    """Relabel an imported run whose injected fault cost its rank less than the reporting
    threshold (5% of a step): such a run must read healthy, and the scenario's documented
    verdict is kept beside as `injected`, with the measurement that says why."""
    path = run / "expected.json"
    expected = json.loads(path.read_text())
    injected = expected.get("injected") or {
        k: expected[k] for k in ("status", "culprits", "categories", "functions")
    }
    relabelled = {
        **expected,
        "status": "healthy",
        "culprits": [],
        "categories": [],
        "functions": [],
        "injected": injected,
        "immaterial": why,
    }
    path.write_text(json.dumps(relabelled, indent=1) + "\n")
    return f"{run.name}: expected healthy ({why})"


# -- command line ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="run.json + expected.json, print the summary line")
    rec.add_argument("out", type=Path)
    rec.add_argument("--scenario", required=True)
    rec.add_argument("--repeat", type=int, required=True)
    rec.add_argument("--rc", type=int, required=True)
    rec.add_argument("--seconds", type=float, required=True)
    rec.add_argument("--expectations", type=Path)
    rec.add_argument("--fact", action="append", default=[], help="KEY=VALUE for run.json")
    rec.add_argument("--log", type=Path, help="the run's output, quoted when it has no verdict")
    pk = commands.add_parser("pack", help="the captures into archives of at most 15 MB")
    pk.add_argument("--runs", type=Path, required=True)
    pk.add_argument("--dest", type=Path, required=True)
    pk.add_argument("--logs", type=Path)
    pk.add_argument("--traces", type=Path)
    pk.add_argument("--part-bytes", type=int, default=PART_BYTES)
    pk.add_argument("--max-files", type=int, default=MAX_FILES)
    imp = commands.add_parser("import", help="archives → DEST/<scenario>-<repeat>/")
    imp.add_argument("dest", type=Path)
    imp.add_argument("archives", type=Path, nargs="+")
    imp.add_argument("--force", action="store_true", help="replace runs already imported")
    imp.add_argument(
        "--repeat-offset", type=int, default=0, help="added to each run's repeat number"
    )
    imm = commands.add_parser(
        "immaterial", help="a run whose fault cost < 5% of a step must read healthy"
    )
    imm.add_argument("runs", type=Path, nargs="+")
    imm.add_argument("--why", required=True, help="the measurement that says so")
    args = parser.parse_args(argv)
    if args.command == "record":
        facts: dict[str, Any] = {}
        for fact in args.fact:
            key, _, value = fact.partition("=")
            facts[key] = int(value) if value.lstrip("-").isdigit() else value
        print(
            record(
                args.out,
                scenario=args.scenario,
                repeat=args.repeat,
                rc=args.rc,
                seconds=args.seconds,
                expectations=args.expectations,
                facts=facts,
                log=args.log,
            )
        )
    elif args.command == "pack":
        notes = pack(
            args.runs,
            args.dest,
            logs=args.logs,
            traces=args.traces,
            part_bytes=args.part_bytes,
            max_files=args.max_files,
        )
        print("\n".join(notes) if notes else "every capture packed")
    elif args.command == "immaterial":
        print("\n".join(mark_immaterial(run, args.why) for run in args.runs))
    else:
        lines = import_archives(
            args.archives, args.dest, force=args.force, repeat_offset=args.repeat_offset
        )
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
