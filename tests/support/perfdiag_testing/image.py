"""The project's image, built from the Dockerfile by the test suite and run from its root
filesystem (no Docker, no image registry).

- The bases stand in for python:3.11-slim and python:3.11: scripts/image-base.sh makes them
  once per machine from Debian's archive (debootstrap) and commits them with buildah into a
  container storage of its own, outside the repository.
- `build_image` builds the Dockerfile with `buildah bud --isolation chroot` on those bases
  (`--build-arg PYTHON_IMAGE/BUILD_IMAGE`), tagged with a hash of what it is made of (the
  files the Dockerfile copies, as .dockerignore lets them through, the Dockerfile and the
  bases): an unchanged checkout reuses the image it built before. During the build the machine's CA bundle is
  mounted over the build's, so pip reaches PyPI wherever this machine does; the image keeps
  its own.
- The image's root filesystem is a buildah working container's mount, one per image, read by
  `rootfs_run` (every container gets an overlay of it of its own).
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # tests/support/perfdiag_testing/image.py
BASE_SCRIPT = ROOT / "scripts" / "image-base.sh"
REPOSITORY = "localhost/perfdiag"
TAG_PREFIX = "test-"
KEEP_IMAGES = 3  # older test images (and their root filesystems) are removed…
IN_USE_SECONDS = 4 * 3600  # …unless a test run asked for them this recently: clones on one
# machine share the cache, and another run may still be running a container of its image
ROOTFS_CONTAINER = "perfdiag-rootfs-"


class ImageBuildFailed(RuntimeError):
    """The base or the image did not build; the message has the log's end."""


@dataclass(frozen=True)
class BuiltImage:
    name: str  # localhost/perfdiag:test-<context hash>
    image_id: str
    rootfs: Path  # the image's files, to be used read-only
    size: str  # as `buildah images` gives it, e.g. "610 MB"
    build_seconds: float  # 0.0 when an earlier build was reused
    user: str  # the image's USER, "uid:gid"
    env: dict[str, str] = field(default_factory=dict)  # the image's ENV
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    workdir: str = "/"


def _run(argv: list[str], what: str, timeout: float = 1800) -> str:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ImageBuildFailed(f"{what}: {exc} (scripts/setup.sh installs buildah)") from exc
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-6000:]
        raise ImageBuildFailed(f"{what} failed ({result.returncode}): {' '.join(argv)}\n{tail}")
    return result.stdout


def _base_script(*args: str) -> list[str]:
    return _run(["bash", str(BASE_SCRIPT), *args], f"scripts/image-base.sh {' '.join(args)}")\
        .splitlines()  # fmt: skip


class Buildah:
    """buildah on the suite's own container storage (scripts/image-base.sh --storage-flags)."""

    def __init__(self) -> None:
        self.flags = _base_script("--storage-flags")

    def __call__(self, *args: str, what: str = "buildah", timeout: float = 1800) -> str:
        return _run(["buildah", *self.flags, *args], what, timeout)

    def exists(self, image: str) -> bool:
        argv = ["buildah", *self.flags, "inspect", "--type", "image", image]
        return subprocess.run(argv, capture_output=True, check=False).returncode == 0

    def inspect(self, image: str) -> dict[str, object]:
        data: dict[str, object] = json.loads(self("inspect", "--type", "image", image))
        return data


def _ignore_patterns(context: Path) -> list[str]:
    path = context / ".dockerignore"
    lines = path.read_text().splitlines() if path.exists() else []
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _ignored(relative: str, patterns: list[str]) -> bool:
    for pattern in patterns:
        bare = pattern.removeprefix("**/")
        if fnmatch.fnmatch(relative, pattern) or relative.split("/")[0] == pattern:
            return True
        if pattern.startswith("**/") and any(
            fnmatch.fnmatch(part, bare) for part in relative.split("/")
        ):
            return True
    return False


def copied_paths(context: Path = ROOT) -> list[str]:
    """What the Dockerfile copies from the build context (COPY without --from), and the
    Dockerfile and .dockerignore themselves."""
    text = (context / "Dockerfile").read_text().replace("\\\n", " ")
    paths = ["Dockerfile", ".dockerignore"]
    for line in text.splitlines():
        words = shlex.split(line, comments=True) if line.strip() else []
        if not words or words[0].upper() != "COPY" or any(w.startswith("--from") for w in words):
            continue
        paths += [w for w in words[1:] if not w.startswith("--")][:-1]
    return paths


def context_hash(context: Path = ROOT, *extra: str) -> str:
    """A hash of the files the Dockerfile copies from `context` (paths, modes and contents,
    as .dockerignore lets them through), of the Dockerfile, and of `extra`."""
    patterns = _ignore_patterns(context)
    digest = hashlib.sha256()
    for item in extra:
        digest.update(f"{item}\n".encode())
    files: list[str] = []
    for source in copied_paths(context):
        top = context / source
        if top.is_file():
            files.append(source)
            continue
        for directory, dirs, names in os.walk(top):
            rel_dir = os.path.relpath(directory, context)
            dirs[:] = [d for d in dirs if not _ignored(f"{rel_dir}/{d}", patterns)]
            files += [f"{rel_dir}/{n}" for n in names if not _ignored(f"{rel_dir}/{n}", patterns)]
    for relative in sorted(set(files)):
        path = context / relative
        if path.is_symlink() or not path.is_file():
            continue
        digest.update(f"{relative}\0{path.stat().st_mode & 0o777:o}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _lock(cache: Path) -> int:
    cache.mkdir(parents=True, exist_ok=True)
    fd = os.open(cache / ".image.lock", os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def cache_dir() -> Path:
    return Path(os.environ.get("PERFDIAG_IMAGE_CACHE") or Path.home() / ".cache/perfdiag/image")


def build_image(context: Path = ROOT, log_path: Path | None = None) -> BuiltImage:
    """The image of `context` (built unless an identical context was built before) and its
    root filesystem. Raises ImageBuildFailed, saying why."""
    names = dict(line.split("=", 1) for line in _base_script() if "=" in line)
    buildah = Buildah()
    tag = TAG_PREFIX + context_hash(context, names["PYTHON_IMAGE"], names["BUILD_IMAGE"])
    name = f"{REPOSITORY}:{tag}"
    fd = _lock(cache_dir())
    try:
        seconds = 0.0
        if not buildah.exists(name):
            ca_bundle = _base_script("--ca-bundle")[-1]
            started = time.monotonic()
            argv = [
                "bud", "--isolation", "chroot", "--layers=false", "--pull=never",
                "--build-arg", f"PYTHON_IMAGE={names['PYTHON_IMAGE']}",
                "--build-arg", f"BUILD_IMAGE={names['BUILD_IMAGE']}",
                "--volume", f"{ca_bundle}:/etc/ssl/certs/ca-certificates.crt:ro",
                "--tag", name, str(context),
            ]  # fmt: skip
            output = buildah(*argv, what="buildah bud (the Dockerfile)")
            seconds = time.monotonic() - started
            if log_path is not None:
                log_path.write_text(output)
        info = buildah.inspect(name)
        rootfs = _rootfs(buildah, name, str(info["FromImageID"]))
        _mark_used(tag)
        _prune(buildah, keep=name)
    finally:
        os.close(fd)
    config = (info.get("OCIv1") or {}).get("config") or {}  # type: ignore[attr-defined]
    env = dict(item.split("=", 1) for item in config.get("Env") or [])
    sizes = json.loads(buildah("images", "--json", name))
    return BuiltImage(
        name=name,
        image_id=str(info["FromImageID"]),
        rootfs=rootfs,
        size=str(sizes[0]["size"]),
        build_seconds=seconds,
        user=str(config.get("User") or "0:0"),
        env=env,
        entrypoint=tuple(config.get("Entrypoint") or ()),
        cmd=tuple(config.get("Cmd") or ()),
        workdir=str(config.get("WorkingDir") or "/"),
    )


def _rootfs(buildah: Buildah, name: str, image_id: str) -> Path:
    """The mount of the image's working container (created once per image)."""
    container = ROOTFS_CONTAINER + image_id[:12]
    listed = json.loads(buildah("containers", "--json") or "[]") or []
    if not any(c.get("containername") == container for c in listed):
        buildah("from", "--pull=never", "--name", container, name, what="buildah from")
    return Path(buildah("mount", container, what="buildah mount").strip())


def _mark_used(tag: str) -> None:
    used = cache_dir() / "used"
    used.mkdir(parents=True, exist_ok=True)
    (used / tag).touch()


def _recently_used(names: list[str]) -> bool:
    now = time.time()
    for name in names:
        marker = cache_dir() / "used" / name.rpartition(":")[2]
        with contextlib.suppress(OSError):
            if now - marker.stat().st_mtime < IN_USE_SECONDS:
                return True
    return False


def _prune(buildah: Buildah, keep: str) -> None:
    """Remove all but the newest KEEP_IMAGES test images and their working containers, sparing
    any image a test run asked for within IN_USE_SECONDS."""
    images = json.loads(buildah("images", "--json") or "[]") or []
    prefix = f"{REPOSITORY}:{TAG_PREFIX}"
    ours = [i for i in images if any(n.startswith(prefix) for n in i["names"] or [])]
    ours.sort(key=lambda i: int(i.get("created") or 0), reverse=True)
    stale = [
        i
        for i in ours[KEEP_IMAGES:]
        if keep not in (i["names"] or []) and not _recently_used(i["names"] or [])
    ]
    containers = json.loads(buildah("containers", "--json") or "[]") or []
    for image in stale:
        for c in containers:
            if c.get("containername") == ROOTFS_CONTAINER + image["id"][:12]:
                subprocess.run(["buildah", *buildah.flags, "rm", c["id"]], capture_output=True)
        subprocess.run(["buildah", *buildah.flags, "rmi", image["id"]], capture_output=True)


def run_in_image(
    image: BuiltImage,
    argv: list[str],
    scratch: Path,
    *,
    user: str | None = None,
    env: dict[str, str] | None = None,
    mounts: dict[str, Path] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """`argv` (the image's ENTRYPOINT + CMD when empty) in the image's files as its user (or
    `user`), with its ENV plus `env`, host folders mounted at `mounts` (inside path → host
    path); `scratch` takes the container's own writes."""
    import sys

    command = argv or [*image.entrypoint, *image.cmd]
    launcher = [
        sys.executable, "-I", "-m", "perfdiag_testing.rootfs_run",
        "--rootfs", str(image.rootfs), "--scratch", str(scratch),
        "--user", user or image.user, "--workdir", image.workdir,
    ]  # fmt: skip
    for inside, host in (mounts or {}).items():
        launcher += ["--mount", f"{inside}={host}"]
    environment = {"HOME": "/tmp", **image.env, **(env or {})}
    return subprocess.run(
        [*launcher, "--", *command],
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
