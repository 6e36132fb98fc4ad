"""Run a callback right after a module is imported, on the importing thread.

The hook is loaded by sitecustomize, long before the training imports torch, and must not
import torch itself (that would slow every Python process started with the hook). It waits
for `torch.optim.optimizer` to be imported and registers its optimizer step hook then: on the
importing thread, before any optimizer can step, so torch's hook table is never changed while
another thread iterates it. The finder stays in `sys.meta_path` after firing (inert): removing
it could make a concurrent import in another thread skip a finder.
"""

from __future__ import annotations

import logging
import sys
from importlib.abc import Loader
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any, Callable, Optional, Sequence

_log = logging.getLogger("perfdiag.hook")


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call `callback(module)` once `name` is imported (now, when it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    sys.meta_path.insert(0, PostImportFinder(name, callback))


class PostImportFinder:
    """A meta path finder that finds nothing itself: it wraps the loader the other finders
    return for one module name so that the callback runs when that module has executed."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.fired = False
        self._callback = callback
        self._searching = False

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]] = None, target: Any = None
    ) -> Optional[ModuleSpec]:
        if fullname != self.name or self.fired or self._searching:
            return None
        self._searching = True  # the other finders must not call back into this one
        try:
            spec: Optional[ModuleSpec] = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._searching = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None  # the ordinary import goes on without the callback
        spec.loader = _NotifyingLoader(spec.loader, self)
        return spec

    def invalidate_caches(self) -> None:
        pass

    def fire(self, module: ModuleType) -> None:
        if self.fired:
            return
        self.fired = True
        try:
            self._callback(module)
        except Exception:
            _log.warning("perfdiag hook: setting up after %s was imported failed", self.name)


class _NotifyingLoader(Loader):
    """Delegates to the real loader; after the module executed, puts the real loader back in
    its attributes and fires the finder's callback."""

    def __init__(self, loader: Any, finder: PostImportFinder) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: ModuleSpec) -> Optional[ModuleType]:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        try:
            self._loader.exec_module(module)
        finally:
            module.__loader__ = self._loader
            spec = getattr(module, "__spec__", None)
            if spec is not None:
                spec.loader = self._loader
        self._finder.fire(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
