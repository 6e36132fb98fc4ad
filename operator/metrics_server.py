"""The /metrics endpoint: prometheus_client's text exposition of a registry, served by aiohttp
(kopf's own HTTP library) in the operator's event loop.

In the event loop, not in a thread of prometheus_client's own server: the per-diagnosis gauges
read kopf's index of PerfDiagnosis objects, which kopf changes in that loop, so a scrape never
reads it half-changed.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

PATH = "/metrics"


class MetricsServer:
    """GET /metrics on `addr`:`port` (0: any free port, `port` then says which)."""

    def __init__(self, registry: CollectorRegistry, addr: str, port: int) -> None:
        self.registry = registry
        self.addr = addr
        self.port = port
        self._runner: web.AppRunner | None = None

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get(PATH, self._metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.addr, self.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        if self.port == 0:
            self.port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}{PATH}"
