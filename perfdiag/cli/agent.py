"""`perfdiag agent`: the sidecar that turns the hook's spool into worker files in storage."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from perfdiag.api.plan import PLAN_SUCCESSORS_ENV
from perfdiag.cli import storage_at
from perfdiag.collector.agent import run_agent
from perfdiag.collector.pod_plan import DEFAULT_POLL_S, PodPlanFollower
from perfdiag.local.errors import CliError

MAX_PLAN_POLL_S = 20.0


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "agent",
        help="follow a spool and upload each rank's window and status (the pod sidecar)",
        description=(
            "Follow the hook's spool folder: upload status.json heartbeats of every rank, and "
            "turn each completed capture window into events.parquet, summary.parquet and "
            "status.json under STORAGE/<plan id>/workers/<rank>/. Runs until SIGTERM/SIGINT "
            "(or one pass with --once)."
        ),
    )
    parser.add_argument("--spool", required=True, type=Path, help="the hook's spool folder")
    parser.add_argument(
        "--storage", required=True, help="storage URI (a path, file://… or s3://bucket/prefix)"
    )
    parser.add_argument(
        "--rank",
        type=int,
        action="append",
        dest="ranks",
        help="only this global rank (repeatable; default: every rank in the spool)",
    )
    parser.add_argument(
        "--plan-file",
        type=Path,
        default=_env_path("PERFDIAG_PLAN"),
        help="the plan file the hook reads, to report heartbeats for a plan the hook has not "
        "taken (default: $PERFDIAG_PLAN)",
    )
    parser.add_argument(
        "--pod", default=os.environ.get("POD_NAME"), help="pod name (default: $POD_NAME)"
    )
    parser.add_argument(
        "--pod-uid",
        default=os.environ.get("POD_UID") or None,
        help="follow this pod's plan in storage (STORAGE/pod-plans/<uid>.json), for the hooks "
        "to read it without waiting for the kubelet (default: $POD_UID; unset: not followed)",
    )
    parser.add_argument(
        "--plan-successors",
        action="store_true",
        default=os.environ.get(PLAN_SUCCESSORS_ENV) == "1",
        help="while the pod's plan is a watch plan, give the hooks the plan that follows it "
        "for every pod (STORAGE/plan-successors/<watch plan id>.json) when there is one "
        f"(default: ${PLAN_SUCCESSORS_ENV} is 1)",
    )
    parser.add_argument(
        "--plan-poll",
        type=float,
        default=DEFAULT_POLL_S,
        help=f"seconds between reads of the pod's plan (default {DEFAULT_POLL_S:g})",
    )
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between spool scans")
    parser.add_argument(
        "--heartbeat", type=float, default=5.0, help="seconds between unchanged-phase uploads"
    )
    parser.add_argument(
        "--no-raw", action="store_true", help="upload summaries only, not events.parquet"
    )
    parser.add_argument("--once", action="store_true", help="one pass over the spool, then exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every upload")


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def main(args: argparse.Namespace) -> int:
    if args.poll <= 0 or args.heartbeat <= 0 or args.plan_poll <= 0:
        raise CliError("--poll, --heartbeat and --plan-poll must be positive")
    if args.plan_poll > MAX_PLAN_POLL_S:
        # The hooks trust the agent's copy of the plan for 30 s after a read (hook spool).
        raise CliError(f"--plan-poll is at most {MAX_PLAN_POLL_S:g} s")
    if not args.spool.is_dir():
        if args.once:
            raise CliError(f"spool folder {args.spool} does not exist")
        args.spool.mkdir(parents=True, exist_ok=True)  # the hook may create ranks later
    storage = storage_at(args.storage)
    logging.basicConfig(
        level=logging.INFO if args.verbose or not args.once else logging.WARNING,
        format="%(asctime)s perfdiag-agent %(levelname)s %(message)s",
    )
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
    pod_plan = None
    if args.pod_uid:
        pod_plan = PodPlanFollower(
            storage,
            args.pod_uid,
            args.spool,
            poll_s=args.plan_poll,
            follow_successors=args.plan_successors,
        )
    state = run_agent(
        args.spool,
        storage,
        stop=stop,
        poll_s=args.poll,
        heartbeat_s=args.heartbeat,
        ranks=args.ranks,
        plan_file=args.plan_file,
        keep_raw=not args.no_raw,
        pod=args.pod,
        once=args.once,
        pod_plan=pod_plan,
    )
    failed = [status for status in state.final.values() if status.phase == "failed"]
    for status in failed:
        print(f"rank {status.rank} plan {status.plan_id}: {status.error}")
    if args.once and state.retries:
        pending = ", ".join(f"{kind} of rank {rank} ({plan})" for kind, rank, plan in state.retries)
        raise CliError(f"storage errors; not uploaded: {pending}")
    return 0
