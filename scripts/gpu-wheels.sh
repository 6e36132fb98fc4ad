#!/usr/bin/env bash
# Download, on a machine with a package index, the wheels that the GPU machine's image lacks, into
# .whl/ (git-ignored): scripts/gpu-check.sh installs them there, where there is no network. The
# image has Python 3.12 with torch, pyarrow, numpy, nvidia-ml-py, jinja2 and pyyaml
# (../shared/gpu-checklist.md); perfdiag's other dependencies come from here, built for it.
#
#     scripts/gpu-wheels.sh            # then: run … carry [".whl"] … scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PERFDIAG_PYTHON:-.venv/bin/python}
mkdir -p .whl
"$python" -m pip download --quiet --dest .whl --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  "pydantic>=2.6,<3" "pydantic-settings>=2.7,<3" "tenacity>=8.3" "isal>=1.6" "minio>=7.2"
ls .whl
