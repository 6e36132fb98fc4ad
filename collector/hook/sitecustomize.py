"""The `sitecustomize` of the injectable hook folder (written there by
perfdiag.collector.hookdir.materialize; that folder goes first on PYTHONPATH).

Installs the perfdiag hook when PERFDIAG_SPOOL and PERFDIAG_PLAN are set (nothing else
happens otherwise, and no failure of ours reaches the process), then runs the sitecustomize
that this one hides: the next one on sys.path, as Python would have run it.
"""

import os
import sys


def _install_perfdiag_hook() -> None:
    if not (os.environ.get("PERFDIAG_SPOOL") and os.environ.get("PERFDIAG_PLAN")):
        return
    try:
        # Only now: every Python process started with this folder on PYTHONPATH runs this
        # file, and one without both variables must not load the hook.
        from perfdiag.collector import hook

        hook.install()
    except Exception as exc:
        try:
            import logging

            logging.getLogger("perfdiag.hook").warning("perfdiag hook: not loaded: %s", exc)
        except Exception:
            pass


def _run_hidden_sitecustomize() -> None:
    """Execute the next `sitecustomize` on sys.path (after this folder) as `sitecustomize`.
    Its own errors propagate, so `site` reports them as it would without perfdiag."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    entries = [os.path.abspath(entry or os.curdir) for entry in sys.path]
    after = entries[entries.index(here) + 1 :] if here in entries else entries
    for entry in after:
        if entry == here:
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
        return


if __name__ == "sitecustomize":  # not when imported as perfdiag.collector.hook.sitecustomize
    _install_perfdiag_hook()
    _run_hidden_sitecustomize()
