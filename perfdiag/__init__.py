"""perfdiag: online performance troubleshooting for distributed PyTorch training.

This module is copied into training pods together with the hook, so it must stay free of
imports beyond the standard library (see docs/design.md §1).
"""

__version__ = "0.1.0"
