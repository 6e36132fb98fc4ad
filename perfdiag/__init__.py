"""perfdiag: online performance troubleshooting for distributed PyTorch training.

This module is copied into training pods together with the hook, so it must stay free of
imports beyond the standard library (see docs/design.md §1).

There, the hook folder comes first on PYTHONPATH and holds only the hook's part of this package;
extending the package path keeps the rest of an installed perfdiag importable in a training
process (a script that imports perfdiag.api while the hook is injected).
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

__version__ = "0.1.0"
