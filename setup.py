"""The one thing pyproject.toml cannot say without an experimental setuptools table: the C
extension, the fast Kineto reader's JSON scanner (the Python C API only; any C compiler).

It is optional: where it cannot be built (no C compiler, as in slim images), setuptools warns
and the install goes on; perfdiag then reads traces with its general reader and says so once
(perfdiag/engine/kineto/native.py)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "perfdiag.engine.kineto._scan",
            sources=["perfdiag/engine/kineto/_scan.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
