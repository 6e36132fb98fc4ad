"""The images of the Kubeflow example and of perfdiag as the suite's kubelet runs them (shared
by the end-to-end tests and `make cluster`)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from perfdiag.collector.hookdir import materialize
from perfdiag.local.demo.scenarios import TRAIN_SCRIPT
from perfdiag_testing.image import BuiltImage
from perfdiag_testing.kubelet import Image

PERFDIAG_IMAGE = "perfdiag:test"
TRAINING_IMAGE = "pytorch-cpu:py3.8"  # the Kubeflow example's image


def images(
    workdir: Path, script: Path = TRAIN_SCRIPT, perfdiag_image: BuiltImage | None = None
) -> dict[str, Image]:
    """The two images, locally: the training image (`script` as demo.py in /workspace, its
    working directory; this machine's Python with torch) and perfdiag: with `perfdiag_image`
    (the image built from the Dockerfile) its own files, user and environment, else the
    development venv's console script with the hook folder at /opt/perfdiag/hook as the
    Dockerfile lays it out."""
    workspace = workdir / "image-pytorch" / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    shutil.copy(script, workspace / "demo.py")
    training = Image(workdir="/workspace", files={"/workspace": workspace})
    if perfdiag_image is not None:
        built = Image(
            entrypoint=perfdiag_image.entrypoint,
            cmd=perfdiag_image.cmd,
            workdir=perfdiag_image.workdir,
            rootfs=perfdiag_image.rootfs,
            user=perfdiag_image.user,
            env=perfdiag_image.env,
        )
        return {PERFDIAG_IMAGE: built, TRAINING_IMAGE: training}
    hook = materialize(workdir / "image-perfdiag" / "hook")
    perfdiag_bin = Path(sys.executable).parent / "perfdiag"
    return {
        PERFDIAG_IMAGE: Image(entrypoint=(str(perfdiag_bin),), files={"/opt/perfdiag/hook": hook}),
        TRAINING_IMAGE: training,
    }


def base_env() -> dict[str, str]:
    """What every container's image would set: PATH (torchrun, python, perfdiag, cp), HOME,
    one thread per rank (CPU cores shared by everything)."""
    return {
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": os.environ.get("HOME", "/root"),
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "LANG": "C.UTF-8",
    }
