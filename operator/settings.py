"""kopf settings and the operator's own configuration.

Everything kopf writes on objects lives under perfdiag.io/, not kopf's defaults
(kopf.zalando.org/...): the finalizer, the handlers' progress annotations and the diff base
(the last handled spec). A cluster can then tell perfdiag's bookkeeping from other kopf
operators', and `kubectl get pdiag -o yaml` shows one prefix.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import kopf

PREFIX = "perfdiag.io"
FINALIZER = f"{PREFIX}/finalizer"
DIFFBASE_KEY = "last-handled-configuration"
PLAN_ANNOTATION = f"{PREFIX}/plan"  # on target pods: the Plan JSON the hooks read (DESIGN.md §3)
COMPONENT = "perfdiag-operator"

RECHECK_ENV = "PERFDIAG_RECHECK_SECONDS"
DEFAULT_RECHECK_SECONDS = 15.0


@dataclass(frozen=True)
class OperatorConfig:
    """What `perfdiag operator` flags (or PERFDIAG_* variables under `kopf run`) set."""

    recheck_seconds: float = DEFAULT_RECHECK_SECONDS

    @classmethod
    def from_env(cls) -> OperatorConfig:
        raw = os.environ.get(RECHECK_ENV)
        if raw is None:
            return cls()
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{RECHECK_ENV}={raw!r} is not a number of seconds") from None
        if not 0.1 <= value <= 3600:
            raise ValueError(f"{RECHECK_ENV}={raw!r}: expected 0.1 to 3600 seconds")
        return cls(recheck_seconds=value)


def configure(settings: kopf.OperatorSettings) -> None:
    """Apply perfdiag's kopf settings (called from the startup handler)."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key=DIFFBASE_KEY
    )
    # kopf's own log lines ("Handler ... succeeded") are not posted as Events; the operator posts
    # its transitions itself (perfdiag.operator.kube.post_event), and kopf's errors still go out.
    settings.posting.level = logging.WARNING
    # Reconnect watches regularly so a silently dropped connection is noticed within minutes.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
