"""`perfdiag operator`: run the PerfDiagnosis operator (kopf) until interrupted.

Equivalent to `kopf run -m perfdiag.operator.handlers --standalone --all-namespaces` with the
perfdiag options set; credentials come from the pod's service account, else $KUBECONFIG.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from perfdiag.local.errors import CliError


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "operator",
        help="run the PerfDiagnosis operator",
        description=(
            "Run the Kubernetes operator serving PerfDiagnosis objects. Install the CRD first "
            "(perfdiag crd | kubectl apply --server-side -f -)."
        ),
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        metavar="NS",
        help="serve only this namespace (repeatable; glob patterns allowed); default: all",
    )
    scope.add_argument(
        "--all-namespaces",
        "-A",
        action="store_true",
        help="serve every namespace (the default)",
    )
    parser.add_argument(
        "--recheck-seconds",
        type=float,
        default=None,
        metavar="S",
        help="how often unfinished diagnoses are looked at again, e.g. for a target that "
        "appears later (default: $PERFDIAG_RECHECK_SECONDS or 15)",
    )
    parser.add_argument(
        "--liveness",
        default=None,
        metavar="URL",
        help="serve a liveness probe, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument(
        "--peering",
        default=None,
        metavar="NAME",
        help="coordinate replicas through kopf's KopfPeering object NAME (its CRD must be "
        "installed); default: standalone, for a single replica",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")


def main(args: argparse.Namespace) -> int:
    # Imported here: kopf and the operator stay out of `perfdiag --help` and the other commands.
    import kopf

    from perfdiag.operator import handlers  # noqa: F401  (registers the handlers with kopf)
    from perfdiag.operator.kube import NoCredentials, new_api_client
    from perfdiag.operator.settings import RECHECK_SECONDS_RANGE, OperatorConfig

    try:
        config = OperatorConfig.from_env()
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    if args.recheck_seconds is not None:
        low, high = RECHECK_SECONDS_RANGE
        if not low <= args.recheck_seconds <= high:
            raise CliError(f"--recheck-seconds must be between {low:g} and {high:g}")
        config = config.model_copy(update={"recheck_seconds": args.recheck_seconds})
    try:
        new_api_client()  # fail now, with a message, rather than retry in kopf's startup
    except NoCredentials as exc:
        raise CliError(str(exc)) from exc

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        logging.getLogger("kubernetes").setLevel(logging.WARNING)
        logging.getLogger("urllib3").setLevel(logging.WARNING)
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=args.peering is None,
        peering_name=args.peering,
        liveness_endpoint=args.liveness,
        memo=kopf.Memo(config=config),
    )
    return 0
