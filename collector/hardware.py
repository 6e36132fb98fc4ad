"""The agent's hardware sampler: GPU (NVML through nvidia-ml-py) and host (/proc) during a window.

Runs in the agent (the sidecar, or the `perfdiag run` process), never in the training process,
and only while a window is open. Each metric is read at the rate its source supports:

| tier | period | metrics |
| --- | --- | --- |
| fast | 1 ms | GPU SM and memory clocks, clock-throttle reasons, NVLink byte counters (NVML); network bytes per interface (/proc/net/dev); each rank process's CPU run and run-queue wait time (/proc/<pid>/schedstat, ns); every 20 ms, its threads' and its child processes' (DataLoader workers: /proc/<pid>/task/<pid>/children) |
| 10 ms | 10 ms | per-core CPU jiffies (/proc/stat; the kernel counts them at USER_HZ = 100 Hz, so faster reads repeat values); GPU power |
| slow | 100 ms | GPU and memory utilization (NVML averages them over 1/6 s … 1 s), temperature, PCIe throughput (NVML measures it over 20 ms per call, so it has a thread of its own), ECC error counts, XID events; host memory (/proc/meminfo) |

The hot loop only reads: /proc files are re-read with one `pread` each into memory and parsed
after the window (one regular expression over all snapshots, reshaped with numpy). Counters
(bytes, jiffies, ns) are stored as read; the analysis turns them into rates over the intervals
it keeps. Timestamps are `time.time_ns()`: Unix-epoch nanoseconds, the clock of the Kineto
trace on the same host.

Without NVML (no GPU, no driver, nvidia-ml-py missing) only the host is sampled and the reason
is logged once per process; everything else works the same.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from perfdiag.api.schema import HARDWARE_SCHEMA, HARDWARE_SCHEMA_ID, WorkerMeta, with_meta

log = logging.getLogger("perfdiag.agent")

FAST_S = 0.001
MEDIUM_S = 0.010
SLOW_S = 0.100
PROCESS_S = 0.020  # a rank's threads and cgroup: a few reads per thread, 50 times a second
HOST = "host"
SLEEP_OVERSHOOT_S = 0.0001
_told_no_gpu = False


@dataclass
class Series:
    """One metric of one device: timestamps and values, appended by a sampler thread."""

    metric: str
    device: str
    counter: bool
    ts: array = field(default_factory=lambda: array("q"))  # type: ignore[type-arg]
    values: array = field(default_factory=lambda: array("d"))  # type: ignore[type-arg]

    def add(self, ts_ns: int, value: float) -> None:
        self.ts.append(ts_ns)
        self.values.append(value)


class _RawFile:
    """A /proc file read whole with one pread per sample; parsed after the window."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        self.ts = array("q")
        self.snapshots: list[bytes] = []

    def read(self, now_ns: int) -> None:
        self.snapshots.append(os.pread(self.fd, 1 << 16, 0))
        self.ts.append(now_ns)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


@dataclass
class _Reader:
    name: str
    period_ns: int
    read: Callable[[int], None]
    next_ns: int = 0
    failed: bool = False


def _no_nvidia_driver(exc: BaseException) -> bool:
    return isinstance(exc, ImportError) or type(exc).__name__ == "NVMLError_LibraryNotFound"


class HardwareSampler:
    """Start with `start()`, read with `snapshot()` (while running) or `stop()`.

    `pids`: rank → process id of the rank processes on this host (their main thread's CPU
    scheduling is sampled). Every GPU NVML sees is sampled; `worker_series` picks a worker's."""

    def __init__(
        self,
        *,
        pids: Mapping[int, int] | None = None,
        use_gpu: bool = True,
        proc: str = "/proc",
        fast_s: float = FAST_S,
    ) -> None:
        self.pids = dict(pids or {})
        self.proc = proc
        self.fast_s = fast_s
        self.notes: list[str] = []
        self.gpu_count = 0
        self._series: dict[tuple[str, str], Series] = {}
        self._raw: dict[str, _RawFile] = {}
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._nvml: Any = None
        self._started_ns = 0
        self._stopped_ns = 0
        self._switch_interval: float | None = None
        self._parse_cache: dict[str, tuple[int, list[Series]]] = {}
        self._open_fds: list[dict[str, int]] = []
        self._fast: list[_Reader] = []
        self._blocking: list[_Reader] = []
        self._setup_host()
        if use_gpu:
            self._setup_gpu()

    # --- setup -----------------------------------------------------------------------------

    def _setup_host(self) -> None:
        for name, period in (("net/dev", FAST_S), ("stat", MEDIUM_S), ("meminfo", SLOW_S)):
            self._raw_reader(f"{self.proc}/{name}", name, period)
        for rank, pid in sorted(self.pids.items()):
            self._raw_reader(f"{self.proc}/{pid}/schedstat", f"schedstat:{rank}", FAST_S)
            self._process_reader(rank, pid)
            self._cgroup_reader(rank, pid)

    def _process_reader(self, rank: int, pid: int) -> None:
        """All of the rank process's threads: CPU run and run-queue wait (summed over
        /proc/<pid>/task/*/schedstat) and the thread count. A rank's extra CPU outside its
        training thread (a busy background thread, extra intra-op threads) shows only here."""
        device = f"rank{rank}"
        run = self._series_for("process_cpu_run_ns", device, counter=True)
        wait = self._series_for("process_runqueue_wait_ns", device, counter=True)
        torch_run = self._series_for("torch_threads_cpu_run_ns", device, counter=True)
        torch_tids: set[str] = set()
        # A thread names itself just after it starts: its name is read again at its first
        # readings (a second at most), then never.
        name_checks: dict[str, int] = {}
        threads = self._series_for("process_threads", device)
        children = self._children_reader(rank, pid)
        tasks = f"{self.proc}/{pid}/task"
        fds: dict[str, int] = {}
        self._open_fds.append(fds)
        # Threads that ended keep counting: their time stays in the process's total.
        gone = [0.0, 0.0, 0.0]  # run, wait, PyTorch's threads' run
        last: dict[str, tuple[float, float]] = {}

        def read(now: int) -> None:
            alive = os.listdir(tasks)
            for tid in list(fds):
                if tid not in alive:
                    os.close(fds.pop(tid))
                    ended_run, ended_wait = last.pop(tid, (0.0, 0.0))
                    gone[0] += ended_run
                    gone[1] += ended_wait
                    if tid in torch_tids:
                        gone[2] += ended_run
                        torch_tids.discard(tid)
                    name_checks.pop(tid, None)
            total_run, total_wait, total_torch = gone
            for tid in alive:
                fd = fds.get(tid)
                try:
                    if fd is None:
                        fd = fds[tid] = os.open(f"{tasks}/{tid}/schedstat", os.O_RDONLY)
                        name_checks[tid] = NAME_CHECKS
                    if name_checks.get(tid, 0) > 0:
                        name_checks[tid] -= 1
                        if _is_torch_thread(f"{tasks}/{tid}/comm"):
                            torch_tids.add(tid)
                            name_checks[tid] = 0
                    fields = os.pread(fd, 128, 0).split()
                except OSError:  # the thread ended between the listing and the read
                    continue
                last[tid] = (float(fields[0]), float(fields[1]))
                total_run += last[tid][0]
                total_wait += last[tid][1]
                if tid in torch_tids:
                    total_torch += last[tid][0]
            run.add(now, total_run)
            wait.add(now, total_wait)
            torch_run.add(now, total_torch)
            threads.add(now, float(len(alive)))
            children(now)

        self._fast.append(_Reader(f"process:{rank}", self._period(PROCESS_S), read))

    def _children_reader(self, rank: int, pid: int) -> Callable[[int], None]:
        """The rank process's child processes (DataLoader workers): CPU run and run-queue wait
        of each one's main thread, summed. A rank blocked on its input queue is slow because
        its workers compute more, or because they wait for a CPU on a busy host: only this
        tells the two apart."""
        device = f"rank{rank}"
        run = self._series_for("children_cpu_run_ns", device, counter=True)
        wait = self._series_for("children_runqueue_wait_ns", device, counter=True)
        listing = f"{self.proc}/{pid}/task/{pid}/children"
        fds: dict[str, int] = {}
        self._open_fds.append(fds)
        last: dict[str, tuple[float, float]] = {}
        gone = [0.0, 0.0]  # children that exited keep their time in the total

        def read(now: int) -> None:
            try:
                with open(listing, "rb") as f:
                    alive = set(f.read().decode().split())
            except OSError:  # the process ended, or no CONFIG_PROC_CHILDREN: no series
                return
            for child in [c for c in fds if c not in alive]:
                os.close(fds.pop(child))
                ended = last.pop(child, (0.0, 0.0))
                gone[0] += ended[0]
                gone[1] += ended[1]
            for child in alive:
                try:
                    fd = fds.get(child)
                    if fd is None:
                        fd = fds[child] = os.open(f"{self.proc}/{child}/schedstat", os.O_RDONLY)
                    fields = os.pread(fd, 128, 0).split()
                    last[child] = (float(fields[0]), float(fields[1]))
                except (OSError, IndexError, ValueError):  # it ended between listing and read
                    continue
            run.add(now, gone[0] + sum(r for r, _ in last.values()))
            wait.add(now, gone[1] + sum(w for _, w in last.values()))

        return read

    def _cgroup_reader(self, rank: int, pid: int) -> None:
        """The CPU quota of the rank's cgroup (a Kubernetes CPU limit) and the time the
        kernel held the group back for it (cpu.stat throttled time).

        The process is sampled from its start, and it may move to another cgroup after that (a
        launcher or the process itself placing it): the group is looked up again once a
        second, and the throttled counters carry on from where the old group's ended."""
        device = f"rank{rank}"
        throttled = self._series_for("cgroup_throttled_ns", device, counter=True)
        periods = self._series_for("cgroup_nr_throttled", device, counter=True)
        state: dict[str, Any] = {"found": None, "fd": None, "next_ns": 0, "offsets": (0.0, 0.0)}

        def attach(now: int) -> None:
            state["next_ns"] = now + 1_000_000_000
            found = cgroup_cpu_dir(self.proc, pid)
            if found == state["found"]:
                return
            try:
                fd = os.open(os.path.join(found[0], "cpu.stat"), os.O_RDONLY) if found else None
            except OSError:
                fd = None
            state["found"] = found
            if state["fd"] is not None:
                # Continue the counters across the move: the new group's first reading is
                # where the old group's last one was.
                last = (throttled.values[-1], periods.values[-1]) if len(throttled.ts) else None
                first = _cpu_stat(fd, found[1]) if fd is not None and found else None
                if last is not None and first is not None:
                    state["offsets"] = (last[0] - first[0], last[1] - first[1])
            state["fd"] = fd
            if fd is not None:
                self._open_fds.append({"cpu.stat": fd})
            quota = cgroup_quota_cores(found[0], found[1]) if found else None
            if quota is not None:
                self._series_for("cgroup_cpu_quota_cores", device).add(now, quota)

        def read(now: int) -> None:
            if now >= state["next_ns"]:
                attach(now)
            fd, found = state["fd"], state["found"]
            if fd is None or found is None:
                return
            value = _cpu_stat(fd, found[1])
            if value is not None:
                throttled.add(now, value[0] + state["offsets"][0])
                periods.add(now, value[1] + state["offsets"][1])

        attach(time.time_ns())
        if state["found"] is None:
            return
        self._fast.append(_Reader(f"cgroup:{rank}", self._period(PROCESS_S), read))

    def _raw_reader(self, path: str, key: str, period_s: float) -> None:
        try:
            raw = _RawFile(path)
        except OSError as exc:
            self.notes.append(f"{path} not sampled: {exc.strerror or exc}")
            return
        self._raw[key] = raw
        self._fast.append(_Reader(key, self._period(period_s), raw.read))

    def _period(self, seconds: float) -> int:
        # The fast tier's period can be changed (benchmarks measure what it achieves).
        return max(int((self.fast_s if seconds == FAST_S else seconds) * 1e9), 1)

    def _setup_gpu(self) -> None:
        global _told_no_gpu
        try:
            import pynvml

            pynvml.nvmlInit()
            count = int(pynvml.nvmlDeviceGetCount())
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded…
            note = f"no GPU sampled (NVML unavailable: {type(exc).__name__}: {exc}); host only"
            if not _no_nvidia_driver(exc):
                # A machine without NVIDIA's library has no GPU to sample: nothing to tell
                # the user (the log still says it once).
                self.notes.append(note)
            if not _told_no_gpu:
                _told_no_gpu = True
                log.info("hardware sampler: %s", note)
            return
        self._nvml = pynvml
        self.gpu_count = count
        for index in range(count):
            self._gpu_readers(pynvml, index)

    def _gpu_readers(self, nvml: Any, index: int) -> None:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        device = f"gpu{index}"
        sm = self._series_for("sm_clock_mhz", device)
        mem = self._series_for("mem_clock_mhz", device)
        throttle = self._series_for("clock_throttle_reasons", device)
        # Renamed "clocks event reasons" in recent drivers; the old name remains as an alias.
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        reasons = reasons or nvml.nvmlDeviceGetCurrentClocksThrottleReasons

        def clocks(now: int) -> None:
            sm.add(now, nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
            mem.add(now, nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM))
            throttle.add(now, float(reasons(handle)))

        self._fast.append(_Reader(f"{device}:clocks", self._period(FAST_S), clocks))
        fields = [
            getattr(nvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", None),
            getattr(nvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", None),
        ]
        if all(f is not None for f in fields) and _answers(nvml, handle, fields):
            tx = self._series_for("nvlink_tx_kib", device, counter=True)
            rx = self._series_for("nvlink_rx_kib", device, counter=True)

            def nvlink(now: int) -> None:
                values = nvml.nvmlDeviceGetFieldValues(handle, fields)
                for series, value in zip((tx, rx), values, strict=True):
                    if value.nvmlReturn == 0:
                        series.add(now, float(value.value.ullVal))

            self._fast.append(_Reader(f"{device}:nvlink", self._period(FAST_S), nvlink))
        power = self._series_for("power_w", device)
        self._fast.append(
            _Reader(
                f"{device}:power",
                self._period(MEDIUM_S),
                lambda now: power.add(now, nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
            )
        )
        util = self._series_for("gpu_util_pct", device)
        mem_util = self._series_for("mem_util_pct", device)
        temp = self._series_for("temperature_c", device)
        ecc = self._series_for("ecc_uncorrected_volatile", device, counter=True)

        def slow(now: int) -> None:
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            util.add(now, rates.gpu)
            mem_util.add(now, rates.memory)
            temp.add(now, nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))

        def ecc_count(now: int) -> None:
            ecc.add(
                now,
                nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                ),
            )

        self._fast.append(_Reader(f"{device}:util", self._period(SLOW_S), slow))
        self._fast.append(_Reader(f"{device}:ecc", self._period(SLOW_S), ecc_count))
        pcie_tx = self._series_for("pcie_tx_kbps", device)
        pcie_rx = self._series_for("pcie_rx_kbps", device)

        def pcie(now: int) -> None:  # blocks ~20 ms inside NVML: its own thread
            pcie_tx.add(now, nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_TX_BYTES))
            pcie_rx.add(now, nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_RX_BYTES))

        self._blocking.append(_Reader(f"{device}:pcie", self._period(SLOW_S), pcie))
        try:
            events = nvml.nvmlEventSetCreate()
            nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
        except Exception as exc:
            self.notes.append(f"{device}: XID events not available ({type(exc).__name__})")
            return
        xid = self._series_for("xid", device)

        def xid_events(now: int) -> None:
            try:
                event = nvml.nvmlEventSetWait_v2(events, 0)
            except nvml.NVMLError_Timeout:
                return
            xid.add(now, float(event.eventData))

        self._fast.append(_Reader(f"{device}:xid", self._period(SLOW_S), xid_events))

    def _series_for(self, metric: str, device: str, *, counter: bool = False) -> Series:
        key = (metric, device)
        if key not in self._series:
            self._series[key] = Series(metric, device, counter)
        return self._series[key]

    # --- running ---------------------------------------------------------------------------

    def start(self) -> None:
        self._started_ns = time.time_ns()
        # The agent processes windows (Python work holding the GIL) while sampling: a thread
        # waiting for the GIL gets it after the switch interval (5 ms by default), which would
        # cap the fast tier at ~200 Hz. Half the fast period keeps 1 kHz reachable.
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, self.fast_s / 2))
        for name, readers in (("fast", self._fast), ("pcie", self._blocking)):
            if readers:
                thread = threading.Thread(
                    target=self._loop, args=(readers,), name=f"perfdiag-hw-{name}", daemon=True
                )
                self._threads.append(thread)
                thread.start()

    def _loop(self, readers: list[_Reader]) -> None:
        clock = time.time_ns
        while not self._stop.is_set():
            now = clock()
            for reader in readers:
                if reader.failed or now < reader.next_ns:
                    continue
                try:
                    reader.read(now)
                except Exception as exc:  # one metric failing must not stop the others
                    reader.failed = True
                    self.notes.append(f"{reader.name} stopped: {type(exc).__name__}: {exc}")
                # Late: the next read is one period from now (no burst to catch up).
                reader.next_ns = max(reader.next_ns + reader.period_ns, now)
            due = min((r.next_ns for r in readers if not r.failed), default=0)
            if not due:
                return
            # time.sleep overshoots by ~0.1 ms here: wake that much early.
            wait = (due - clock()) / 1e9 - SLEEP_OVERSHOOT_S
            if wait > 0:
                time.sleep(wait)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2.0)
        if self._switch_interval is not None:
            sys.setswitchinterval(self._switch_interval)
            self._switch_interval = None
        self._stopped_ns = time.time_ns()
        for raw in self._raw.values():
            raw.close()
        for fds in self._open_fds:
            for fd in fds.values():
                with contextlib.suppress(OSError):
                    os.close(fd)
            fds.clear()
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None

    # --- results ---------------------------------------------------------------------------

    def samples(self) -> list[Series]:
        """Every series so far (a consistent copy; the sampler may keep running)."""
        found = [
            Series(s.metric, s.device, s.counter, s.ts[: len(s.values)], s.values[:])
            for s in list(self._series.values())
        ]
        for key, raw in list(self._raw.items()):
            found += self._parsed(key, raw)
        return [s for s in found if len(s.ts) == len(s.values) and len(s.ts)]

    def _parsed(self, key: str, raw: _RawFile) -> list[Series]:
        """The file's series so far: the snapshots parsed by an earlier call are not parsed
        again (the agent asks once per rank while the sampler runs)."""
        n = len(raw.ts)
        done, series = self._parse_cache.get(key, (0, []))
        if n > done:
            new = parse_raw(key, raw.ts[done:n], raw.snapshots[done:n])
            if done and [(a.metric, a.device) for a in new] == [
                (b.metric, b.device) for b in series
            ]:
                series = [
                    Series(a.metric, a.device, a.counter, a.ts + b.ts, a.values + b.values)
                    for a, b in zip(series, new, strict=True)
                ]
            else:  # first call, or the lines changed (an interface appeared): parse it all
                series = parse_raw(key, raw.ts[:n], raw.snapshots[:n])
            self._parse_cache[key] = (n, series)
        return [Series(s.metric, s.device, s.counter, s.ts, s.values) for s in series]


def parse_raw(key: str, ts: Sequence[int], snapshots: Sequence[bytes]) -> list[Series]:
    """Series from the snapshots of one /proc file."""
    if not snapshots:
        return []
    if key == "net/dev":
        return _parse_net_dev(ts, snapshots)
    if key == "stat":
        return _parse_stat(ts, snapshots)
    if key == "meminfo":
        return _parse_meminfo(ts, snapshots)
    if key.startswith("schedstat:"):
        return _parse_schedstat(key.split(":", 1)[1], ts, snapshots)
    return []


_NET_LINE = re.compile(
    rb"^\s*([^\s:]+):\s*(\d+)\s+\d+\s+\d+\s+\d+\s+\d+\s+\d+\s+\d+\s+\d+\s+(\d+)", re.M
)
_CPU_LINE = re.compile(rb"^cpu(\d*) +(\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)", re.M)
_MEM_LINE = re.compile(rb"^(MemTotal|MemAvailable):\s+(\d+) kB", re.M)


def _table_of(pattern: re.Pattern[bytes], snapshots: Sequence[bytes]) -> list[tuple[bytes, ...]]:
    """All matches of `pattern` over all snapshots (one pass over their concatenation)."""
    return pattern.findall(b"\n".join(snapshots))


def _by_snapshot(
    matches: list[tuple[bytes, ...]], n: int
) -> tuple[list[bytes], np.ndarray[Any, Any]] | None:
    """(names, (n, k, fields) numbers) when every snapshot has the same k lines in order."""
    if not matches or len(matches) % n:
        return None
    k = len(matches) // n
    names = [m[0] for m in matches[:k]]
    if [m[0] for m in matches[k : 2 * k]] != names and n > 1:
        return None
    numbers = np.array([m[1:] for m in matches], dtype=np.float64).reshape(n, k, -1)
    return names, numbers


def _parse_net_dev(ts: Sequence[int], snapshots: Sequence[bytes]) -> list[Series]:
    shaped = _by_snapshot(_table_of(_NET_LINE, snapshots), len(snapshots))
    if shaped is None:
        return []
    names, numbers = shaped
    out = []
    stamps = array("q", ts)
    for i, name in enumerate(names):
        device = "net:" + name.decode(errors="replace")
        for j, metric in enumerate(("net_rx_bytes", "net_tx_bytes")):
            out.append(Series(metric, device, True, stamps, array("d", numbers[:, i, j])))
    return out


def _parse_stat(ts: Sequence[int], snapshots: Sequence[bytes]) -> list[Series]:
    shaped = _by_snapshot(_table_of(_CPU_LINE, snapshots), len(snapshots))
    if shaped is None:
        return []
    names, numbers = shaped  # user nice system idle iowait irq softirq steal
    idle = numbers[:, :, 3] + numbers[:, :, 4]
    total = numbers.sum(axis=2)
    out = []
    stamps = array("q", ts)
    for i, name in enumerate(names):
        device = "cpu" + name.decode() if name else "cpu"
        out.append(Series("cpu_total_jiffies", device, True, stamps, array("d", total[:, i])))
        out.append(
            Series("cpu_busy_jiffies", device, True, stamps, array("d", total[:, i] - idle[:, i]))
        )
        out.append(Series("cpu_steal_jiffies", device, True, stamps, array("d", numbers[:, i, 7])))
    running = re.findall(rb"^procs_running (\d+)", b"\n".join(snapshots), re.M)
    if len(running) == len(snapshots):
        out.append(Series("procs_running", HOST, False, stamps, array("d", map(float, running))))
    return out


def _parse_meminfo(ts: Sequence[int], snapshots: Sequence[bytes]) -> list[Series]:
    shaped = _by_snapshot(_table_of(_MEM_LINE, snapshots), len(snapshots))
    if shaped is None:
        return []
    names, numbers = shaped
    metric = {b"MemTotal": "mem_total_bytes", b"MemAvailable": "mem_available_bytes"}
    stamps = array("q", ts)
    return [
        Series(metric[name], HOST, False, stamps, array("d", numbers[:, i, 0] * 1024))
        for i, name in enumerate(names)
    ]


def _parse_schedstat(rank: str, ts: Sequence[int], snapshots: Sequence[bytes]) -> list[Series]:
    parts = b" ".join(s.strip() for s in snapshots).split()
    if len(parts) != 3 * len(snapshots):
        return []
    numbers = np.array(parts, dtype=np.float64).reshape(-1, 3)
    stamps = array("q", ts)
    device = f"rank{rank}"
    return [
        Series("cpu_run_ns", device, True, stamps, array("d", numbers[:, 0])),
        Series("cpu_runqueue_wait_ns", device, True, stamps, array("d", numbers[:, 1])),
    ]


def achieved_rates(series: Sequence[Series]) -> dict[str, float]:
    """Samples per second of each metric (the median over its devices)."""
    by_metric: dict[str, list[float]] = {}
    for s in series:
        if len(s.ts) > 1:
            span = (s.ts[-1] - s.ts[0]) / 1e9
            if span > 0:
                by_metric.setdefault(s.metric, []).append((len(s.ts) - 1) / span)
    return {metric: float(np.median(rates)) for metric, rates in sorted(by_metric.items())}


def gpu_index(local_rank: int | None) -> int | None:
    """The NVML index of a local rank's GPU: the local rank's entry of CUDA_VISIBLE_DEVICES
    when it lists indexes (torchrun's convention: local rank i uses visible device i), else the
    local rank itself (NVML does not follow CUDA_VISIBLE_DEVICES)."""
    if local_rank is None:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if local_rank < len(entries) and entries[local_rank].isdigit():
        return int(entries[local_rank])
    return local_rank


def _cpu_stat(fd: int, version: int) -> tuple[float, float] | None:
    """(throttled ns, throttled periods) from an open cpu.stat; None when unreadable."""
    try:
        text = os.pread(fd, 1024, 0)
    except OSError:
        return None
    values = dict(line.split()[:2] for line in text.splitlines() if len(line.split()) >= 2)
    # v2: throttled_usec, v1: throttled_time (ns)
    throttled = (
        float(values.get(b"throttled_usec", 0)) * 1000.0
        if version == 2
        else float(values.get(b"throttled_time", 0))
    )
    return throttled, float(values.get(b"nr_throttled", 0))


def cgroup_cpu_dir(proc: str, pid: int) -> tuple[str, int] | None:
    """The folder of the cgroup that holds `pid`'s CPU controller, and the cgroup version;
    None when it cannot be found (no cgroup file system mounted, another namespace)."""
    try:
        with open(f"{proc}/{pid}/cgroup") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        names = controllers.split(",")
        if "cpu" in names:
            for mount in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):
                folder = mount + path
                if os.path.exists(os.path.join(folder, "cpu.stat")):
                    return folder, 1
    for line in lines:
        if line.startswith("0::"):
            folder = "/sys/fs/cgroup" + line[3:]
            if os.path.exists(os.path.join(folder, "cpu.stat")):
                return folder, 2
    return None


def cgroup_quota_cores(folder: str, version: int) -> float | None:
    """The group's CPU limit in cores; None when unlimited or unreadable."""
    try:
        if version == 2:
            with open(os.path.join(folder, "cpu.max")) as handle:
                quota, period = handle.read().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        with open(os.path.join(folder, "cpu.cfs_quota_us")) as handle:
            quota_us = int(handle.read())
        with open(os.path.join(folder, "cpu.cfs_period_us")) as handle:
            period_us = int(handle.read())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def worker_series(series: Sequence[Series], rank: int, gpu_index: int | None) -> list[Series]:
    """What belongs in one worker's hardware.parquet: the host's metrics, its own GPU's and
    its own process's."""
    own = {f"rank{rank}"} | ({f"gpu{gpu_index}"} if gpu_index is not None else set())
    return [s for s in series if s.device in own or not s.device.startswith(("gpu", "rank"))]


def within(series: Sequence[Series], start_ns: int, end_ns: int) -> list[Series]:
    """The samples taken in [start_ns, end_ns]."""
    out = []
    for s in series:
        ts = np.frombuffer(s.ts, dtype=np.int64) if len(s.ts) else np.zeros(0, np.int64)
        lo = int(np.searchsorted(ts, start_ns, side="left"))
        hi = int(np.searchsorted(ts, end_ns, side="right"))
        out.append(Series(s.metric, s.device, s.counter, s.ts[lo:hi], s.values[lo:hi]))
    return out


def hardware_table(series: Sequence[Series], meta: WorkerMeta) -> pa.Table:
    """HARDWARE_SCHEMA rows (long format) with the worker's metadata."""
    lengths = [len(s.ts) for s in series]
    total = sum(lengths)
    if total:
        ts = np.concatenate([np.frombuffer(s.ts, dtype=np.int64) for s in series if len(s.ts)])
        values = np.concatenate(
            [np.frombuffer(s.values, dtype=np.float64) for s in series if len(s.ts)]
        )
    else:
        ts, values = np.zeros(0, np.int64), np.zeros(0)
    index = np.repeat(np.arange(len(series), dtype=np.int32), lengths)
    metrics = pa.DictionaryArray.from_arrays(
        pa.array(index, pa.int32()), pa.array([s.metric for s in series], pa.string())
    )
    devices = pa.DictionaryArray.from_arrays(
        pa.array(index, pa.int32()), pa.array([s.device for s in series], pa.string())
    )
    counters = np.array([s.counter for s in series], dtype=bool)[index]
    table = pa.table(
        {
            "rank": pa.array(np.full(total, meta.rank, dtype=np.int32)),
            "ts_ns": pa.array(ts),
            "metric": metrics.cast(pa.string()),
            "device": devices.cast(pa.string()),
            "value": pa.array(values),
            "counter": pa.array(counters),
        },
        schema=HARDWARE_SCHEMA,
    )
    return table.replace_schema_metadata(
        with_meta(HARDWARE_SCHEMA, HARDWARE_SCHEMA_ID, meta).metadata
    )


def _answers(nvml: Any, handle: Any, fields: list[Any]) -> bool:
    """Whether the driver answers any of these field values for the device. A GPU without
    NVLink (a single-GPU VM: an H100 here) answers none; polling them each millisecond would
    cost an NVML call, and a round trip of the GIL, per sample for nothing."""
    try:
        return any(v.nvmlReturn == 0 for v in nvml.nvmlDeviceGetFieldValues(handle, fields))
    except Exception:
        return False


NAME_CHECKS = 50
"""Readings of a new thread (20 ms apart) at which its name is read, for one set just after
it started."""
TORCH_THREAD_PREFIX = b"pt_"
"""PyTorch names its own threads pt_*: pt_autograd_<device> (the autograd engine's device
threads, which run the backward pass of CUDA tensors), pt_nccl_*, pt_gloo_*. Their CPU is the
rank's own work; only the process's other threads can compete with it."""


def _is_torch_thread(comm_path: str) -> bool:
    """Whether the thread's name (read once, when it is first seen) is one of PyTorch's."""
    try:
        with open(comm_path, "rb") as f:
            return f.read().startswith(TORCH_THREAD_PREFIX)
    except OSError:
        return False
