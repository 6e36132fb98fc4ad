"""Collection on the workers: the in-process hook and the agent (DESIGN.md §1).

This package is copied into training pods with the hook; keep it free of heavy imports.
`perfdiag.collector.step()` marks a step boundary explicitly for loops without an optimizer.
"""


def step() -> None:
    """Mark the end of a training step (only needed when no torch optimizer is used)."""
    from perfdiag.collector import hook

    hook.step()
