"""Real servers for the test suite: etcd + kube-apiserver and MinIO on loopback (docs/design.md §6).

Used by the session fixtures in tests/conftest.py; importable (unlike tests/, which pytest loads
in importlib mode) and free of pytest imports so it can also be driven by hand or by benchmarks.
"""
