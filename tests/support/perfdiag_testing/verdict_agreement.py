"""Does a verdict agree with itself? Every number the headline, the terminal, verdict.json and
report.html give of the same quantity must be the same number, formatted the same way.

`disagreements` lists what does not agree (empty when all does): for each rank named for its
time, the excess, the step it is a share of and its time outside communication against its
peers' appear in its finding's message as verdict.json's evidence has them; the summary (the
headline) repeats the top finding's; the terminal shows the summary and every rank's median
step; the report shows the summary and, in its Workers table, each named rank's time outside
communication.
"""

from __future__ import annotations

import html
import re

from perfdiag.analyzer.text import ms
from perfdiag.api.verdict import Verdict
from perfdiag.local.verdict_text import render_verdict


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def disagreements(verdict: Verdict, report_html: str) -> list[str]:
    problems: list[str] = []
    terminal = _flat(render_verdict(verdict))
    report = _flat(html.unescape(report_html))
    if _flat(verdict.summary) not in terminal:
        problems.append("the terminal does not show the verdict's summary")
    if _flat(verdict.summary) not in report:
        problems.append("the report does not show the verdict's summary")
    for rank, median in verdict.window.step_time_ms.per_rank.items():
        if f"{rank}: {median:.1f}" not in terminal:
            problems.append(f"the terminal lacks rank {rank}'s median step {median:.1f}")
    for number, finding in enumerate(verdict.findings):
        if finding.kind != "slow_worker":
            continue
        lead = finding.evidence["workers"][0]
        said = {
            "excess": ms(lead["excess_ms_per_step"]),
            "step": ms(lead["step_ms"]),
            "time outside communication": ms(lead["non_communication_ms_per_step"]),
            "peers' time outside communication": ms(
                lead["peers_median_non_communication_ms_per_step"]
            ),
        }
        for what, text in said.items():
            if text not in finding.message:
                problems.append(f"finding {number}: its message lacks the {what} {text}")
        if number == 0:
            for what in ("excess", "step"):
                if said[what] not in verdict.summary:
                    problems.append(f"the summary lacks the top finding's {what} {said[what]}")
        row = said["time outside communication"]
        in_row = rf"<tr><td class=\"num\">{lead['rank']}</td>(?:(?!</tr>).)*?{re.escape(row)}"
        if not re.search(in_row, report_html, re.S):
            problems.append(
                f"the report's Workers table lacks rank {lead['rank']}'s {row} outside "
                "communication"
            )
    return problems
