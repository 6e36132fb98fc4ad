"""The one thing pyproject.toml cannot say without an experimental setuptools table: the C
extension, the fast Kineto reader's JSON scanner (the Python C API only; any C compiler)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "perfdiag.kineto._scan",
            sources=["perfdiag/kineto/_scan.c"],
            extra_compile_args=["-O2"],
        )
    ]
)
