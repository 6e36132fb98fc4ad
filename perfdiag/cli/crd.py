"""`perfdiag crd`: print the PerfDiagnosis CRD rendered from the API models."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from perfdiag.local.errors import CliError


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "crd",
        help="print the PerfDiagnosis CustomResourceDefinition",
        description=(
            "Render the PerfDiagnosis CRD from the pydantic models (the single source). "
            "Install it with: perfdiag crd | kubectl apply --server-side -f -"
        ),
    )
    parser.add_argument(
        "--output",
        "-o",
        default="-",
        metavar="FILE",
        help="write to FILE instead of standard output ('-', the default)",
    )


def main(args: argparse.Namespace) -> int:
    # Here, not at the top: rendering builds the PerfDiagnosis models (0.1 s), which
    # `perfdiag --help`, loading every command's module, would spend too.
    from perfdiag.api.crd import render_crd_yaml

    text = render_crd_yaml()
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    path = Path(args.output)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return 0
