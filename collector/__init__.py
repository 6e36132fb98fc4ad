"""Collection on the workers: the in-process hook and the agent (docs/design.md §1).

This package is copied into training pods with the hook; keep it free of heavy imports.
`perfdiag.collector.step()` marks a step boundary explicitly for loops without an optimizer.
"""

from pkgutil import extend_path
from typing import Callable, Optional

# In a training process the hook folder's copy of this package comes first: keep the installed
# collector's other modules (the agent) importable there too, as for perfdiag/__init__.py.
__path__ = extend_path(__path__, __name__)

_hook_step: Optional[Callable[[], None]] = None


def step() -> None:
    """Mark the end of a training step (only needed when no torch optimizer is used)."""
    global _hook_step
    if _hook_step is None:
        # At the first call: every collector module (the agent's too) runs this package first,
        # and must not load the hook with it.
        from perfdiag.collector.hook import step as hook_step

        _hook_step = hook_step
    _hook_step()
