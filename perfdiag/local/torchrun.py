"""torchrun-compatible options: declared once here, accepted by `perfdiag run`, and passed
through unchanged to `python -m torch.distributed.run`.

torch is not imported here, so `perfdiag --help` stays fast; a test checks the table against
the installed torch's own torchrun parser.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from perfdiag.local.errors import CliError


@dataclass(frozen=True)
class TorchrunOption:
    """One torchrun option. `flags[0]` is the spelling passed to torchrun; the first long flag
    names it."""

    flags: tuple[str, ...]
    takes_value: bool
    help: str

    @property
    def dest(self) -> str:
        long_flag = next(flag for flag in self.flags if flag.startswith("--"))
        return "torchrun_" + long_flag[2:].replace("-", "_")


def _opt(*flags: str, help: str, value: bool = True) -> TorchrunOption:
    return TorchrunOption(flags=flags, takes_value=value, help=help)


TORCHRUN_OPTIONS: tuple[TorchrunOption, ...] = (
    _opt("--nnodes", help="number of nodes, or MIN:MAX (default 1)"),
    _opt(
        "--nproc-per-node",
        "--nproc_per_node",
        help="ranks per node: an integer, or auto, cpu, gpu (default 1)",
    ),
    _opt("--node-rank", "--node_rank", help="rank of this node (static rendezvous)"),
    _opt("--master-addr", "--master_addr", help="address of node rank 0 (static rendezvous)"),
    _opt("--master-port", "--master_port", help="port on node rank 0 (static rendezvous)"),
    _opt("--local-addr", "--local_addr", help="address of this node"),
    _opt("--rdzv-backend", "--rdzv_backend", help="rendezvous backend"),
    _opt("--rdzv-endpoint", "--rdzv_endpoint", help="rendezvous endpoint HOST:PORT"),
    _opt("--rdzv-id", "--rdzv_id", help="rendezvous (job) id"),
    _opt("--rdzv-conf", "--rdzv_conf", help="rendezvous configuration K=V,K=V"),
    _opt("--standalone", help="local standalone rendezvous on a free port", value=False),
    _opt("--max-restarts", "--max_restarts", help="worker group restarts before failing"),
    _opt("--monitor-interval", "--monitor_interval", help="seconds between worker checks"),
    _opt("--start-method", "--start_method", help="multiprocessing start method"),
    _opt("--event-log-handler", "--event_log_handler", help="torchelastic event log handler"),
    _opt("--role", help="user-defined role of the workers"),
    _opt("-m", "--module", help="run the script as a module, like python -m", value=False),
    _opt("--no-python", "--no_python", help="run the script directly (not Python)", value=False),
    _opt("--run-path", "--run_path", help="run the script with runpy.run_path", value=False),
    _opt("--log-dir", "--log_dir", help="directory for worker log files"),
    _opt("-r", "--redirects", help="redirect worker streams into log files"),
    _opt("-t", "--tee", help="tee worker streams into log files"),
    _opt(
        "--log-line-prefix-template",
        "--log_line_prefix_template",
        help="prefix template for tee'd lines",
    ),
    _opt("--local-ranks-filter", "--local_ranks_filter", help="only show these ranks' logs"),
    _opt(
        "--duplicate-stdout-filters",
        "--duplicate_stdout_filters",
        help="duplicate filtered stdout lines to a file",
    ),
    _opt(
        "--duplicate-stderr-filters",
        "--duplicate_stderr_filters",
        help="duplicate filtered stderr lines to a file",
    ),
    _opt("--logs-specs", "--logs_specs", help="torchrun.logs_specs entrypoint name"),
    _opt("--numa-binding", "--numa_binding", help="bind workers to CPUs near their GPUs"),
    _opt("--signals-to-handle", "--signals_to_handle", help="signals forwarded to workers"),
    _opt("--shutdown-timeout", "--shutdown_timeout", help="seconds before SIGKILL on shutdown"),
    _opt(
        "--virtual-local-rank",
        "--virtual_local_rank",
        help="LOCAL_RANK 0 for every worker",
        value=False,
    ),
)

# Options whose presence means the user chose how ranks find each other.
_RENDEZVOUS_DESTS = {
    "torchrun_standalone",
    "torchrun_rdzv_backend",
    "torchrun_rdzv_endpoint",
    "torchrun_master_addr",
    "torchrun_master_port",
}


def add_torchrun_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "torchrun options", "passed through unchanged to torch.distributed.run"
    )
    for option in TORCHRUN_OPTIONS:
        if option.takes_value:
            group.add_argument(
                *option.flags,
                dest=option.dest,
                default=None,
                metavar=option.dest.removeprefix("torchrun_").upper(),
                help=option.help,
            )
        else:
            group.add_argument(
                *option.flags, dest=option.dest, action="store_true", help=option.help
            )


@dataclass(frozen=True)
class LaunchTarget:
    """What torchrun starts on each rank: a script, a module (-m) or a program (--no-python)."""

    entry: str
    args: tuple[str, ...]
    module: bool
    no_python: bool


def target_from(args: argparse.Namespace) -> LaunchTarget:
    """The training command from the positional words after the options (and an optional --)."""
    words = list(args.command)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise CliError(
            "no training script given: perfdiag run [OPTIONS] -- train.py [SCRIPT ARGS]", 2
        )
    return LaunchTarget(
        entry=words[0],
        args=tuple(words[1:]),
        module=bool(args.torchrun_module),
        no_python=bool(args.torchrun_no_python),
    )


def nnodes_max(args: argparse.Namespace) -> int:
    """The largest node count the --nnodes value allows (torchrun accepts N or MIN:MAX)."""
    value = args.torchrun_nnodes or os.environ.get("PET_NNODES") or "1"
    try:
        return int(str(value).split(":")[-1])
    except ValueError:
        raise CliError(f"--nnodes {value!r}: expected N or MIN:MAX", 2) from None


def local_world_size(args: argparse.Namespace) -> int:
    """How many ranks torchrun will start on this node (it resolves auto/cpu/gpu the same way)."""
    value = args.torchrun_nproc_per_node or os.environ.get("PET_NPROC_PER_NODE") or "1"
    try:
        count = int(value)
    except ValueError:
        from torch.distributed.run import determine_local_world_size

        try:
            count = int(determine_local_world_size(value))
        except ValueError as exc:
            raise CliError(f"--nproc-per-node {value!r}: {exc}", 2) from None
    if count < 1:
        raise CliError(f"--nproc-per-node {value!r}: must be at least 1", 2)
    return count


def torchrun_argv(args: argparse.Namespace, target: LaunchTarget) -> list[str]:
    """`python -m torch.distributed.run …` with the user's torchrun options, unchanged.

    A single-node run that names no rendezvous gets --standalone: torchrun would otherwise use
    the fixed port 29500, and two local runs at once would collide.
    """
    argv = [sys.executable, "-m", "torch.distributed.run"]
    chosen = {option.dest for option in TORCHRUN_OPTIONS if getattr(args, option.dest)}
    if nnodes_max(args) == 1 and not chosen & _RENDEZVOUS_DESTS:
        argv.append("--standalone")
    for option in TORCHRUN_OPTIONS:
        value = getattr(args, option.dest)
        if option.takes_value and value is not None:
            argv += [option.flags[0], str(value)]
        elif not option.takes_value and value:
            argv.append(option.flags[0])
    return [*argv, target.entry, *target.args]
