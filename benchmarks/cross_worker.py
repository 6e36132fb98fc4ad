"""Cross-worker analysis of many workers' summaries (docs/design.md §5, docs/benchmarks.md).

1. Writes N workers' files as the agent writes them (collector/agent.py `process_window`): per
   worker, `summary.parquet` (a SUMMARY_SCHEMA table tagged by `with_meta`, encoded by
   `table_to_bytes`) and `status.json` (`WorkerStatus.model_dump_json()`), under the keys of
   `perfdiag.storage.layout`, plus the `plan.json` of the capture. The job is the analyzer
   tests' synchronous data-parallel CPU job (tests/analyzer/conftest.py: its functions, step
   model and jitters), generated chunk by chunk in parallel processes, with one injected Python
   hotspot on rank N·2/3. The files go to a local folder (`--keep DIR` writes them once and
   reuses them; plain file writes: the agent's fsync only orders a write for crash safety) or
   to the test suite's real MinIO (`--minio`, through `S3Storage.put_bytes`, the agent's writer).
2. Runs `perfdiag analyze SOURCE` as a fresh process (start and imports included) and reports
   its wall time, CPU time (its whole process tree), peak RSS of the tree (sampled every 0.1 s)
   and of its largest process, the time per stage from its progress lines (listing, fetching,
   decoding, validating, comparing, writing), the culprit found, and the sizes of verdict.json,
   report.html, timeline.json.gz and the terminal output.

    python benchmarks/cross_worker.py --ranks 100000 --keep /tmp/cap100k
    python benchmarks/cross_worker.py --ranks 100000 --minio --keep /tmp/minio100k
    python benchmarks/cross_worker.py --ranks 100000 --memory     # analyze_capture in memory

The machine is shared: every figure is printed with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

import numpy as np
import pyarrow as pa

from perfdiag.api.plan import Plan
from perfdiag.api.schema import SUMMARY_SCHEMA, SUMMARY_SCHEMA_ID, WindowMeta, WorkerMeta, with_meta
from perfdiag.api.verdict import Verdict
from perfdiag.api.worker import WorkerStatus
from perfdiag.engine.parquet_io import table_to_bytes
from perfdiag.storage import Storage, layout
from perfdiag.storage.s3 import S3Storage
from tests.analyzer.conftest import COMM, CPU_FUNCTIONS, CPU_TRANSFER_MS

REPO = Path(__file__).resolve().parents[1]
CULPRIT_FUNCTION = ("train.py(57): tokenize", "python")
CULPRIT_MS = 40.0
STEPS = 10
START_STEP = 6
PLAN_ID = "bench"
CHUNK = 4096
"""Workers per generation task (its arrays: CHUNK × STEPS × functions)."""
UPLOAD_THREADS = 32
"""PUTs in flight per generating process (MinIO)."""
RSS_EVERY_S = 0.1


# -- the job ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """conftest.SyntheticJob's CPU job (functions, ±5% per-rank speed, ±8% per-step noise, the
    collective completing when the slowest rank arrives), generated for any rank range from
    seeds of its own, so that chunks are made apart and alike."""

    n_ranks: int
    seed: int = 3
    step_jitter: float = 0.08
    rank_jitter: float = 0.05

    @property
    def culprit(self) -> int:
        return self.n_ranks * 2 // 3

    @property
    def names(self) -> list[tuple[str, str]]:
        return [(f, c) for f, c, _ in CPU_FUNCTIONS] + [CULPRIT_FUNCTION]

    def work(self, first: int, last: int) -> np.ndarray:
        """(R, S, F) ms of each function in each step, ranks first … last − 1."""
        rng = np.random.default_rng([self.seed, 0, first])
        base = np.array([ms for _, _, ms in CPU_FUNCTIONS] + [0.0])
        n = last - first
        speed = 1.0 + rng.uniform(-self.rank_jitter, self.rank_jitter, size=(n, 1, 1))
        noise = 1.0 + rng.uniform(-self.step_jitter, self.step_jitter, size=(n, STEPS, len(base)))
        work = base * speed * noise
        if first <= self.culprit < last:
            work[self.culprit - first, :, -1] += CULPRIT_MS
        return work

    def transfer_ms(self) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 1])
        return CPU_TRANSFER_MS * (1.0 + rng.uniform(-self.step_jitter, self.step_jitter, STEPS))


def busiest(job: Job, first: int, last: int) -> np.ndarray:
    """(S,) the longest time outside the collective of ranks first … last − 1, per step."""
    return job.work(first, last).sum(axis=2).max(axis=0)


def chunk_files(
    job: Job, first: int, last: int, step_ms: np.ndarray
) -> Iterator[tuple[int, bytes, bytes]]:
    """(rank, summary.parquet, status.json) of ranks first … last − 1."""
    work = job.work(first, last)
    comm = step_ms[None, :] - work.sum(axis=2)  # (R, S): transfer + waiting for the slowest
    ms = np.concatenate([work, comm[:, :, None]], axis=2)  # (R, S, F+1)
    names = [*job.names, (COMM, "communication")]
    window_ms = float(step_ms.sum())
    total = ms.sum(axis=1)  # (R, F+1)
    r_idx, f_idx = np.nonzero(total > 0)
    beta = total[r_idx, f_idx] / window_ms
    order = np.lexsort((f_idx, -beta, r_idx))  # the engine's order: by rank, β descending
    r_idx, f_idx, beta = r_idx[order], f_idx[order], beta[order]
    time_ms = total[r_idx, f_idx]
    per_step = (ms / step_ms[None, :, None])[r_idx, :, f_idx].astype(np.float32)
    table = pa.table(
        {
            "rank": pa.array(r_idx + first, pa.int32()),
            "function": pa.array([names[j][0] for j in f_idx], pa.string()),
            "category": pa.array([names[j][1] for j in f_idx], pa.string()),
            "beta": pa.array(beta, pa.float64()),
            "time_ms": pa.array(time_ms, pa.float64()),
            "count": pa.array(np.full(len(r_idx), 3 * STEPS), pa.int64()),
            "wall_ms": pa.array(time_ms * 1.1, pa.float64()),
            "dur_median_us": pa.array(time_ms / (3 * STEPS) * 1000, pa.float64()),
            "dur_p95_us": pa.array(time_ms / (3 * STEPS) * 1500, pa.float64()),
            "resource": pa.nulls(len(r_idx), pa.string()),
            "resource_mu": pa.nulls(len(r_idx), pa.float64()),
            "resource_sigma": pa.nulls(len(r_idx), pa.float64()),
            "beta_per_step": pa.ListArray.from_arrays(
                pa.array(np.arange(len(r_idx) + 1, dtype=np.int32) * STEPS),
                pa.array(per_step.reshape(-1), pa.float32()),
            ),
        },
        schema=SUMMARY_SCHEMA,
    )
    starts = np.searchsorted(r_idx, np.arange(last - first))
    ends = np.searchsorted(r_idx, np.arange(last - first), side="right")
    bounds = np.concatenate([[0], np.cumsum(step_ms * 1e6)]).astype(np.int64)
    now = time.time()
    for i in range(last - first):
        rank = first + i
        host, pod = f"node-{rank // 8:06d}", f"train-worker-{rank}"
        offset = 1_000_000_000 * (rank % 997 + 1)  # every rank has its own trace clock
        meta = WorkerMeta(
            rank=rank,
            world_size=job.n_ranks,
            local_rank=rank % 8,
            host=host,
            pod=pod,
            pid=1000 + rank % 8,
            window=WindowMeta(
                id=PLAN_ID,
                start_step=START_STEP,
                steps=STEPS,
                step_bounds_ns=[
                    (int(offset + bounds[s]), int(offset + bounds[s + 1])) for s in range(STEPS)
                ],
            ),
            torch_version="2.5.1",
        )
        part = table.slice(int(starts[i]), int(ends[i] - starts[i]))
        summary = table_to_bytes(part.cast(with_meta(SUMMARY_SCHEMA, SUMMARY_SCHEMA_ID, meta)))
        status = WorkerStatus(
            rank=rank,
            host=host,
            pod=pod,
            plan_id=PLAN_ID,
            phase="done",
            step=START_STEP + STEPS + 1,
            last_step_unix=now,
            updated_unix=now,
            files=[layout.worker_key(rank, layout.SUMMARY)],
        )
        yield rank, summary, status.model_dump_json().encode()


# -- writing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where the workers' files go: a local folder, or an S3 prefix with its variables."""

    folder: Path | None = None
    s3_uri: str | None = None
    s3_env: tuple[tuple[str, str], ...] = ()

    def storage(self) -> Storage:
        if self.s3_uri is not None:
            return S3Storage.from_uri(self.s3_uri, dict(self.s3_env))
        from perfdiag.storage.local import LocalStorage

        assert self.folder is not None
        return LocalStorage(self.folder)


def write_chunk(task: tuple[Job, Target, int, int, np.ndarray]) -> int:
    job, target, first, last, step_ms = task
    files = chunk_files(job, first, last, step_ms)
    if target.folder is not None:
        for rank, summary, status in files:
            folder = target.folder / layout.WORKERS / str(rank)
            folder.mkdir(parents=True, exist_ok=True)
            (target.folder / layout.worker_key(rank, layout.SUMMARY)).write_bytes(summary)
            (target.folder / layout.worker_key(rank, layout.STATUS)).write_bytes(status)
        return last - first
    storage = target.storage()

    def put(item: tuple[int, bytes, bytes]) -> None:
        rank, summary, status = item
        storage.put_bytes(layout.worker_key(rank, layout.SUMMARY), summary)
        storage.put_bytes(layout.worker_key(rank, layout.STATUS), status)

    with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
        for _ in pool.map(put, files):
            pass
    return last - first


def write_job(job: Job, target: Target, processes: int) -> None:
    """Every worker's files, `processes` chunks at a time; the plan last (what a reader of a
    half-written capture sees missing)."""
    chunks = [(i, min(i + CHUNK, job.n_ranks)) for i in range(0, job.n_ranks, CHUNK)]
    started = time.perf_counter()
    with ProcessPoolExecutor(processes) as pool:
        peaks = list(pool.map(_busiest_task, [(job, a, b) for a, b in chunks]))
        step_ms = np.max(peaks, axis=0) + job.transfer_ms()
        done = 0
        tasks = [(job, target, a, b, step_ms) for a, b in chunks]
        for count in pool.map(write_chunk, tasks):
            done += count
            if done % (CHUNK * 16) < CHUNK or done == job.n_ranks:
                rate = done / (time.perf_counter() - started)
                print(f"  wrote {done:,}/{job.n_ranks:,} workers ({rate:,.0f}/s)", flush=True)
    plan = Plan.new(plan_id=PLAN_ID, steps=STEPS, activities=["cpu"], timeout_s=86400)
    target.storage().put_text(layout.PLAN, plan.to_json())


def _busiest_task(task: tuple[Job, int, int]) -> np.ndarray:
    return busiest(*task)


# -- MinIO -----------------------------------------------------------------------------------


def start_minio(workdir: Path) -> object:
    """The suite's MinIO (tests/support/perfdiag_testing/minio_server.py, the binary of
    scripts/test-binaries.sh) on `workdir`; its credentials and bucket are kept there, so a
    later run reuses what an earlier one uploaded."""
    from perfdiag_testing.minio_server import MinioServer
    from perfdiag_testing.processes import free_port

    binary = Path(
        subprocess.run(
            [str(REPO / "scripts" / "test-binaries.sh")], capture_output=True, text=True, check=True
        ).stdout.split()[-1]
    )
    server = MinioServer(binary / "minio", workdir)
    saved = workdir / "bench.json"
    if saved.exists():
        state = json.loads(saved.read_text())
        server.access_key, server.secret_key, server.bucket = (
            state["access_key"],
            state["secret_key"],
            state["bucket"],
        )
        server.port, server.console_port = free_port(), free_port()  # not first: no new bucket
        server.start()
    else:
        server.start()
        saved.write_text(
            json.dumps(
                {
                    "access_key": server.access_key,
                    "secret_key": server.secret_key,
                    "bucket": server.bucket,
                }
            )
        )
    return server


# -- measuring `perfdiag analyze` --------------------------------------------------------------


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and all its descendants."""
    total = 0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    pending += [int(c) for c in children.read().split()]
        except (OSError, ValueError):
            continue  # gone meanwhile
    return total


def process_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    wall_s: float
    cpu_user_s: float
    cpu_system_s: float
    peak_tree_rss: int
    peak_process_rss: int
    returncode: int
    stdout: str
    stderr: str
    load_before: float
    load_after: float
    server_cpu_s: float | None


def run_analyze(source: str, env: dict[str, str], server_pid: int | None) -> Run:
    command = [str(Path(sys.executable).with_name("perfdiag")), "analyze", source]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_before = process_cpu_s(server_pid) if server_pid else None
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd="/", text=True
    )
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.wait(RSS_EVERY_S):
            peak = max(peak, tree_rss_bytes(child.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = child.communicate()
    wall = time.perf_counter() - started
    stop.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return Run(
        wall_s=wall,
        cpu_user_s=after.ru_utime - before.ru_utime,
        cpu_system_s=after.ru_stime - before.ru_stime,
        peak_tree_rss=peak,
        peak_process_rss=after.ru_maxrss * 1024,
        returncode=child.returncode,
        stdout=stdout,
        stderr=stderr,
        load_before=load_before,
        load_after=os.getloadavg()[0],
        server_cpu_s=process_cpu_s(server_pid) - server_before
        if server_pid and server_before is not None
        else None,
    )


COUNTING = re.compile(r"^perfdiag: loaded \d+(/\d+)? workers$")


def report(run: Run, read: Callable[[str], bytes], job: Job, where: str) -> None:
    lines = run.stderr.splitlines()
    shown = [line for line in lines if not COUNTING.match(line) or line.endswith(
        f" {job.n_ranks}/{job.n_ranks} workers")]  # fmt: skip
    for line in shown:
        print("  " + line)
    if run.returncode not in (0, 1):
        print("\n".join(lines[-20:]))
        raise SystemExit(f"perfdiag analyze failed (exit {run.returncode})")
    verdict_bytes = read(layout.VERDICT)
    verdict = Verdict.model_validate_json(verdict_bytes)
    top = verdict.findings[0] if verdict.findings else None
    sizes = {
        "verdict.json": len(verdict_bytes),
        "report.html": len(read(layout.REPORT)),
        "timeline.json.gz": len(read(layout.TIMELINE)),
        # What `perfdiag analyze` prints: the verdict (stdout) and its progress lines (stderr).
        "terminal verdict": len(run.stdout.encode()),
        "progress lines": len(run.stderr.encode()),
    }
    print(
        f"{where}: `perfdiag analyze` of {job.n_ranks:,} workers: wall {run.wall_s:.1f} s, CPU "
        f"{run.cpu_user_s:.1f} s user + {run.cpu_system_s:.1f} s system"
        + (f" (MinIO {run.server_cpu_s:.1f} s)" if run.server_cpu_s is not None else "")
        + f", peak RSS {run.peak_tree_rss / 1e9:.2f} GB (process tree; largest process "
        f"{run.peak_process_rss / 1e9:.2f} GB); load {run.load_before:.1f} → {run.load_after:.1f}"
    )
    print(
        f"  culprit: {top.kind + ' ' + top.category + ' ranks ' + str(top.ranks) if top else None}"
        f" (injected {job.culprit}); status {verdict.status}; "
        + ", ".join(f"{name} {size / 1e3:,.1f} KB" for name, size in sizes.items())
    )
    print(f"  verdict: {len(verdict.workers)} rows in workers, "
          f"{len(verdict.window.step_time_ms.per_rank)} step times per rank")  # fmt: skip


# -- the in-memory stage ---------------------------------------------------------------------


def memory_stage(n_ranks: int) -> None:
    from perfdiag.analyzer.pipeline import analyze_capture
    from perfdiag.analyzer.report.html import render_report
    from perfdiag.analyzer.report.verdict import verdict_of
    from tests.analyzer.conftest import Fault, SyntheticJob, capture_of

    culprit = n_ranks * 2 // 3
    started = time.perf_counter()
    table, metas = SyntheticJob(
        n_ranks=n_ranks, seed=3, faults=[Fault([culprit], *CULPRIT_FUNCTION, CULPRIT_MS)]
    ).build()
    print(f"built {table.num_rows:,} summary rows for {n_ranks:,} workers "
          f"in {time.perf_counter() - started:.1f} s")  # fmt: skip
    started = time.perf_counter()
    analysis = analyze_capture(capture_of(table, metas))
    verdict = verdict_of(analysis)
    html = render_report(analysis, verdict)
    elapsed = time.perf_counter() - started
    top = verdict.findings[0] if verdict.findings else None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"memory: analyze_capture + report for {n_ranks:,} workers in {elapsed:.1f} s; "
        f"report {len(html) / 1e6:.2f} MB; top finding {top.ranks if top else None} "
        f"(injected {culprit}); peak RSS {peak:.0f} MB; load {os.getloadavg()[0]:.1f}"
    )


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=100_000)
    parser.add_argument("--memory", action="store_true", help="the in-memory stage only")
    parser.add_argument("--minio", action="store_true", help="write to and read from MinIO")
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="folder to write the capture (or MinIO) once and reuse",
    )
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--clean", action="store_true", help="remove --keep's folder at the end")
    args = parser.parse_args()
    if args.memory:
        memory_stage(args.ranks)
        return
    job = Job(args.ranks)
    work = args.keep or Path(f"/tmp/perfdiag-xw-{args.ranks}-{'minio' if args.minio else 'local'}")
    work.mkdir(parents=True, exist_ok=True)
    server = None
    try:
        env = dict(os.environ)
        if args.minio:
            server = start_minio(work)
            env.update(server.env())  # type: ignore[attr-defined]
            prefix = f"s3://{server.bucket}/bench-{args.ranks}"  # type: ignore[attr-defined]
            target = Target(s3_uri=prefix, s3_env=tuple(server.env().items()))  # type: ignore[attr-defined]
        else:
            target = Target(folder=work / "capture")
        storage = target.storage()
        if storage.exists(layout.PLAN):
            print(f"reusing the {args.ranks:,} workers' files in {storage.uri}")
        else:
            started = time.perf_counter()
            write_job(job, target, args.processes)
            print(f"wrote {args.ranks:,} workers' files to {storage.uri} in "
                  f"{time.perf_counter() - started:.0f} s")  # fmt: skip
        for key in (layout.VERDICT, layout.REPORT, layout.TIMELINE):
            storage.delete(key)
        server_pid = server.process.pid if server is not None else None  # type: ignore[attr-defined]
        result = run_analyze(storage.uri, env, server_pid)
        report(result, storage.get_bytes, job, "minio" if args.minio else "local")
    finally:
        if server is not None:
            server.stop()  # type: ignore[attr-defined]
        if args.clean:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
