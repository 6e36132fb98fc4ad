"""report.html: self-contained, and actually rendered by a browser (headless Chromium)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

from perfdiag.analyzer import analyze
from perfdiag.analyzer.pipeline import analyze_capture
from perfdiag.analyzer.report.html import render_report
from perfdiag.analyzer.report.verdict import verdict_of
from perfdiag.api.worker import WorkerStatus
from perfdiag.storage import layout
from perfdiag.storage.local import LocalStorage
from tests.analyzer.conftest import Fault, SyntheticJob, capture_of, run_chromium, write_capture

TOKENIZE = "train.py(57): tokenize"

# Appended to a COPY of the report (the report itself has no script): measures what the
# browser laid out and painted, and writes it into the DOM for --dump-dom.
PROBE = """<script>
(function () {
  function box(el) {
    el.scrollIntoView({block: "center"});
    const b = el.getBoundingClientRect();
    const hit = document.elementFromPoint(b.left + b.width / 2, b.top + b.height / 2);
    return {w: b.width, h: b.height, fill: getComputedStyle(el).fill, painted: hit === el,
            title: (el.querySelector("title") || {}).textContent || ""};
  }
  const out = {
    bars: Array.from(document.querySelectorAll("svg.chart rect.bar")).map(box),
    cells: Array.from(document.querySelectorAll("svg.heatmap rect.cell")).map(box),
    flags: document.querySelectorAll("svg.heatmap rect.flag").length,
    segments: Array.from(document.querySelectorAll("svg.chart rect.segment")).map(box),
    summary: document.querySelector(".summary").innerText,
    badge: getComputedStyle(document.querySelector(".badge")).backgroundColor,
    width: document.documentElement.scrollWidth,
  };
  const pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def _probe(report: Path, work: Path) -> dict[str, object]:
    harness = work / "probe.html"
    harness.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    dom = run_chromium(harness, work, "--window-size=1400,1000", "--dump-dom")
    match = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert match, f"probe did not run; DOM tail: {dom[-500:]}"
    data: dict[str, object] = json.loads(unescape(match.group(1)))
    return data


class _References(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href", "xlink:href", "action", "data", "poster") and value:
                self.refs.append(value)


def _report_of(job: SyntheticJob, **capture_kwargs: object) -> str:
    table, metas = job.build()
    analysis = analyze_capture(capture_of(table, metas, **capture_kwargs))  # type: ignore[arg-type]
    return render_report(analysis, verdict_of(analysis))


def test_report_is_self_contained() -> None:
    html = _report_of(SyntheticJob(n_ranks=4, seed=1, faults=[Fault([2], TOKENIZE, "python", 40)]))
    parser = _References()
    parser.feed(html)
    assert parser.refs == []  # no src/href at all: nothing to fetch
    assert "script" not in parser.tags and "link" not in parser.tags
    assert "iframe" not in parser.tags and "img" not in parser.tags
    assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", html, re.I)
    assert "@import" not in html and "url(" not in html
    assert html.count("<svg") >= 3  # step time, breakdown, heatmap


def test_report_escapes_function_names() -> None:
    evil = "<script>alert(1)</script>"
    html = _report_of(SyntheticJob(n_ranks=4, seed=2, faults=[Fault([1], evil, "python", 40)]))
    assert "<script" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "capture")
    table, metas = SyntheticJob(
        n_ranks=6, seed=3, faults=[Fault([2], TOKENIZE, "python", 40)]
    ).build()
    gone = WorkerStatus(rank=5, phase="capturing", step=9, last_step_unix=1.0, updated_unix=2.0)
    write_capture(storage, table, metas, drop=[5], statuses={5: gone})
    verdict = analyze(storage)
    assert verdict.status == "incomplete"
    report = storage.local_path(layout.REPORT)
    assert report is not None

    probe = _probe(report, tmp_path)
    bars = probe["bars"]
    assert isinstance(bars, list) and len(bars) == 6  # 5 analysed + the missing one's placeholder
    assert all(b["w"] > 5 and b["h"] > 5 for b in bars)
    culprit = bars[2]
    assert culprit["fill"] == "rgb(214, 39, 40)" and culprit["painted"]
    assert "rank 2" in culprit["title"] and "median step" in culprit["title"]
    assert bars[5]["fill"] == "none" and "missing" in bars[5]["title"]
    assert all(b["fill"] == "rgb(78, 121, 167)" for i, b in enumerate(bars) if i not in (2, 5))

    cells = probe["cells"]
    assert isinstance(cells, list) and len(cells) >= 5 * 10  # ≥ 10 functions × 5 ranks
    assert len(cells) % 5 == 0
    assert all(c["w"] > 5 and c["h"] > 5 and c["painted"] for c in cells)
    assert any(TOKENIZE in c["title"] and "OUTLIER" in c["title"] for c in cells)
    assert probe["flags"] == 1  # rank 2 × tokenize

    segments = probe["segments"]
    assert isinstance(segments, list) and len(segments) >= 5 * 4
    assert all(s["w"] > 5 and s["painted"] for s in segments if s["h"] > 2)
    assert "Rank 5 is missing" in str(probe["summary"])
    assert probe["badge"] == "rgb(84, 110, 122)"  # the 'incomplete' colour
    assert probe["width"] <= 1400  # nothing overflows the window horizontally

    shot = tmp_path / "report.png"
    run_chromium(report, tmp_path, "--window-size=1400,2000", f"--screenshot={shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 50_000  # charts and text, not a blank page


def test_report_of_many_ranks_shows_a_readable_subset(tmp_path: Path) -> None:
    html = _report_of(
        SyntheticJob(n_ranks=200, seed=4, faults=[Fault([137], TOKENIZE, "python", 40)])
    )
    report = tmp_path / "report.html"
    report.write_text(html)
    probe = _probe(report, tmp_path)
    bars = probe["bars"]
    assert isinstance(bars, list) and len(bars) == 64
    assert sum(b["fill"] == "rgb(214, 39, 40)" for b in bars) == 1
    assert any("rank 137" in b["title"] for b in bars)
    assert "Showing 64 of 200 ranks" in html
    assert probe["width"] <= 1400


def test_healthy_report_says_so() -> None:
    html = _report_of(SyntheticJob(n_ranks=4, seed=5))
    assert 'class="badge healthy"' in html
    assert "No finding above the reporting threshold" in html


def test_collective_view_renders_for_gpu_traces(tmp_path: Path) -> None:
    """Kineto traces with NCCL collectives: the wait/transfer chart is drawn and painted, the
    straggler's bar says it arrives last, its peers' bars carry the waiting."""
    from perfdiag_testing.synthetic_trace import TraceFault, TraceJob

    traces = tmp_path / "traces"
    TraceJob(n_ranks=4, faults=[TraceFault("compute_straggler", (1,), factor=2.0)]).write(traces)
    analyze(str(traces))
    probe = _probe(traces / layout.REPORT, tmp_path)
    segments = probe["segments"]
    assert isinstance(segments, list)
    waits = [s for s in segments if "waiting for the last rank" in s["title"]]
    transfers = [s for s in segments if " · transfer:" in s["title"]]
    assert len(transfers) == 4 and all(s["painted"] and s["h"] > 0 for s in transfers)
    assert {s["title"].split(" ")[1] for s in waits} >= {"0", "2", "3"}
    culprit = [s for s in transfers if s["title"].startswith("rank 1 ")]
    assert culprit and "arrived last in 100%" in culprit[0]["title"]


def test_untrusted_text_is_escaped_and_never_evaluated() -> None:
    """Names from traces go through the template's autoescaping as text: markup is escaped,
    template syntax stays literal, control characters pass through as they are."""
    names = ["{{ 7*7 }} {% if x %}", "\x1b]0;pwned\x07 a & b 'q' \"qq\""]
    faults = [Fault([1], names[0], "python", 40), Fault([2], names[1], "cpu_op", 35)]
    html = _report_of(SyntheticJob(n_ranks=4, seed=2, faults=faults))
    assert "{{ 7*7 }} {% if x %}" in html and ">49<" not in html
    assert "\x1b]0;pwned\x07 a &amp; b &#39;q&#39; &#34;qq&#34;" in html


def test_rendering_imports_jinja2_only_when_called() -> None:
    code = (
        "import sys; import perfdiag.analyzer.report.html as r; "
        "print('jinja2' in sys.modules, hasattr(r, 'render_report'))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["False", "True"]


def _render_in(tmp: Path, traces: Path, out: Path) -> int:
    """`perfdiag analyze` in a fresh interpreter whose temporary directory is `tmp`: the size
    of its report."""
    code = (
        f"from perfdiag.cli import main; main(['analyze', {str(traces)!r}, '--out', {str(out)!r}])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
        cwd="/",
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return len((out / layout.REPORT).read_text())


def test_compiled_template_is_cached_and_a_bad_cache_folder_fails_nothing(tmp_path: Path) -> None:
    from perfdiag_testing.synthetic_trace import TraceJob

    traces = tmp_path / "traces"
    TraceJob(n_ranks=2, n_steps=4).write(traces)
    cache = tmp_path / "cache"
    cache.mkdir()
    first = _render_in(cache, traces, tmp_path / "a")
    (cached,) = list(cache.glob("_jinja2-cache-*/*.cache"))
    assert cached.stat().st_size > 0
    assert _render_in(cache, traces, tmp_path / "b") == first  # rendered from the cached code
    # A file where the cache folder would be: the template is compiled each time instead.
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / cached.parent.name).write_text("not a folder")
    assert _render_in(blocked, traces, tmp_path / "c") > 0
