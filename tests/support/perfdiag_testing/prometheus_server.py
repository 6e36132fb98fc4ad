"""A real Prometheus for tests (Debian's `prometheus`, installed by scripts/setup.sh): loopback
port, a fresh TSDB, a scrape and rule evaluation every second, and its HTTP API to query.

What it scrapes and which rules it evaluates is given at start (perfdiag_testing.monitoring
makes both from the chart): the tests read the series and alerts a user's Prometheus would hold.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from perfdiag_testing.processes import ServerProcess, ServerStartError, free_port

BINARY_VARIABLE = "PERFDIAG_PROMETHEUS"
HOW_TO_INSTALL = (
    "Install Debian's prometheus package (scripts/setup.sh does, with apt-get as root), or set "
    f"{BINARY_VARIABLE} to a prometheus binary."
)
INTERVAL = "1s"
START_ATTEMPTS = 3

T = TypeVar("T")


class PrometheusMissing(RuntimeError):
    """No prometheus binary; the message says how to get one."""


def find_prometheus(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    configured = env.get(BINARY_VARIABLE)
    found = shutil.which(configured) if configured else shutil.which("prometheus")
    if not found:
        where = f"{BINARY_VARIABLE}={configured}" if configured else "PATH"
        raise PrometheusMissing(f"no prometheus binary on {where}. {HOW_TO_INSTALL}")
    return Path(found)


def find_promtool(prometheus: Path) -> Path:
    """promtool, shipped beside prometheus (Debian's package has both)."""
    beside = prometheus.with_name("promtool")
    found = str(beside) if beside.exists() else shutil.which("promtool")
    if not found:
        raise PrometheusMissing(f"no promtool beside {prometheus} or on PATH. {HOW_TO_INSTALL}")
    return Path(found)


class PrometheusServer:
    def __init__(
        self,
        binary: Path,
        workdir: Path,
        scrape_configs: Sequence[Mapping[str, Any]],
        rule_groups: Mapping[str, Any] | None = None,
    ) -> None:
        self.binary = binary
        self.workdir = workdir
        self.scrape_configs = [dict(c) for c in scrape_configs]
        self.rule_groups = dict(rule_groups) if rule_groups is not None else None
        self.port = 0
        self.ready_seconds = 0.0
        self.process: ServerProcess | None = None
        # Where the scraped operator serves its metrics, when the starter chose it (the
        # suite's fixture: the in-process operator of the tests listens there).
        self.operator_port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "logs" / "prometheus.log"

    def _write_config(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config: dict[str, Any] = {
            "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL},
            "scrape_configs": self.scrape_configs,
        }
        if self.rule_groups is not None:
            rules = self.workdir / "rules.yaml"
            rules.write_text(yaml.safe_dump(self.rule_groups, sort_keys=False))
            config["rule_files"] = [str(rules)]
        path = self.workdir / "prometheus.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def _process(self, config: Path) -> ServerProcess:
        argv = [
            str(self.binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1d",
            "--log.level=warn",
        ]
        return ServerProcess("prometheus", argv, self.log_path, dict(os.environ))

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def start(self, timeout: float = 60) -> None:
        """Start and wait until Prometheus is ready (from the main thread: see ServerProcess)."""
        started = time.monotonic()
        config = self._write_config()
        for attempt in range(1, START_ATTEMPTS + 1):
            self.port = free_port()
            self.process = self._process(config)
            self.process.start()
            try:
                self.process.wait_ready(self._ready, timeout=timeout)
            except ServerStartError as exc:
                self.process.stop(kill=True)
                if not exc.port_conflict or attempt == START_ATTEMPTS:
                    raise
                continue
            break
        self.ready_seconds = time.monotonic() - started

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def log_files(self) -> list[Path]:
        return [self.log_path]

    # ---- the HTTP API ----------------------------------------------------------------------

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; its `data` (an error names the query)."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"Prometheus refused {path} {params}: {exc.read()!r}") from exc
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus answered {body} to {path} {params}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query: [{"metric": {...}, "value": [time, "value"]}, ...]."""
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"] if data["resultType"] == "vector" else []
        return result

    def values(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """An instant query's samples as (labels, value)."""
        return [(dict(s["metric"]), float(s["value"][1])) for s in self.query(expr)]

    def wait_for(self, probe: Callable[[], T | None], what: str, timeout: float = 30.0) -> T:
        """Poll `probe` (which queries this server) until it returns something truthy."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            found = probe()
            if found:
                return found
            last = found
            time.sleep(0.5)
        raise AssertionError(
            f"timed out after {timeout:g}s waiting in Prometheus for {what} (last: {last!r}); "
            f"targets: {self.targets()}"
        )

    def targets(self) -> list[tuple[str, str, str]]:
        """(job, health, last error) of every active scrape target."""
        data = self.api("targets")
        return [
            (t["labels"].get("job", ""), t["health"], t.get("lastError", ""))
            for t in data["activeTargets"]
        ]

    def firing(self, alertname: str, **labels: str) -> list[dict[str, str]]:
        """The labels of the firing alerts `alertname` whose labels include `labels`."""
        found = self.api("alerts")["alerts"]
        return [
            dict(a["labels"]) | {"_description": a.get("annotations", {}).get("description", "")}
            for a in found
            if a["state"] == "firing"
            and a["labels"].get("alertname") == alertname
            and all(a["labels"].get(k) == v for k, v in labels.items())
        ]
