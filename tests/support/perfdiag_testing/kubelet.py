"""A kubelet (and Job controller) for tests: runs the pods and Jobs of one namespace of the test
control plane as local processes (docs/design.md §6: "the suite plays kubelet for its few pods").

What it does, as the real ones would:
- every pod gets its own loopback address 127.0.0.<n> (status.podIP), and env values naming
  another pod (a PyTorchJob's MASTER_ADDR is the master pod's service name) resolve to that
  pod's address (cluster DNS);
- volumes: emptyDir (a folder per pod) and downwardAPI (metadata.annotations / labels written
  in the kubelet's format, `key="value"` with Go %q quoting; one of them,
  metadata.annotations['key'], as its raw value, an empty file when absent; refreshed when the
  pod's metadata changes, at the next sync as a kubelet's event-driven remount does, or, with
  `downward_api_resync_s`, only at the pod's periodic resync, as a kubelet that missed the
  update does: every 60–90 s with the default syncFrequency); other volume types are refused
  (the pod fails);
- containers: init containers in order, native sidecars (init containers with restartPolicy
  Always) kept running and restarted when they exit, then the main containers; when they end
  the sidecars get SIGTERM; the pod's phase (Running, Succeeded, Failed) and podIP are written
  to its status;
- env: value with $(VAR) expansion, fieldRef (name, namespace, uid, podIP, nodeName,
  annotations, labels), secretKeyRef and envFrom secretRef, read from the API server;
- images are local: `Image` maps an image name to its ENTRYPOINT/CMD, working directory and the
  files it carries (e.g. /opt/perfdiag/hook); container paths in command, args and env values
  are translated to the pod's folders (volume mounts) or the image's files. An image with a
  root filesystem (`Image.rootfs`, the image the suite builds from the Dockerfile) runs its
  containers inside it instead (perfdiag_testing.rootfs_run): an overlay of the image per
  container, the pod's volumes mounted at their paths (readOnly kept), the image's ENV and USER
  (securityContext runAsUser/runAsGroup win), HOME from the image's /etc/passwd; emptyDirs are
  world-writable, as the kubelet makes them, so containers of different users share them;
- Jobs (batch/v1): the pod template runs up to backoffLimit+1 times, within
  activeDeadlineSeconds; status (startTime, active, succeeded/failed, completionTime, the
  SuccessCriteriaMet/Complete or FailureTarget/Failed conditions) is written back; a deleted
  Job's process is stopped.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

log = logging.getLogger("perfdiag_testing.kubelet")

_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_FIELD = re.compile(r"^metadata\.(annotations|labels)\['([^']+)'\]$")


def go_quote(value: str) -> str:
    """strconv.Quote (what the kubelet's downward-API file uses), for valid UTF-8 text."""
    escapes = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
               "\v": "\\v", "\\": "\\\\", '"': '\\"'}  # fmt: skip
    out = []
    for char in value:
        code = ord(char)
        if char in escapes:
            out.append(escapes[char])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif not char.isprintable():
            out.append(f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def format_map(values: Mapping[str, str]) -> str:
    """k8s.io/kubernetes/pkg/fieldpath.FormatMap: sorted `key="value"` lines."""
    return "".join(f"{key}={go_quote(values[key])}\n" for key in sorted(values))


def _subscripted(path: str, meta: Mapping[str, Any]) -> str | None:
    """metadata.annotations['key'] / metadata.labels['key']: the value as it is, "" when absent
    (Kubernetes' fieldpath.ExtractFieldPathAsString, for env and downward-API files alike);
    None for another path."""
    match = _FIELD.match(path)
    if match is None:
        return None
    return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined variables replaced, others left as written,
    $$ → $."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _VAR.sub(sub, text)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Image:
    """A container image, locally: either commands of this machine with some of the image's
    paths mapped to host folders (`files`), or, with `rootfs`, the image's own root filesystem
    (see `LocalPod.container`)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    workdir: str | None = None  # a path inside the image (mapped through `files`)
    files: Mapping[str, Path] = field(default_factory=dict)  # image path → host path
    rootfs: Path | None = None  # the image's files (perfdiag_testing.image.build_image)
    user: str = "0:0"  # the image's USER, uid:gid (rootfs images)
    env: Mapping[str, str] = field(default_factory=dict)  # the image's ENV (rootfs images)


KUBELET_LOG = "kubelet"
"""`log_text(KUBELET_LOG)`: why the local kubelet failed a pod, next to its containers' logs."""


class PodFailed(RuntimeError):
    pass


class _Container:
    """One container's process."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], cwd: Path, log_path: Path):
        self.name, self.argv, self.env, self.cwd, self.log_path = name, argv, env, cwd, log_path
        self.popen: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.keep_dead = False  # a test killed it for good (e.g. an agent that crashes)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            out.write(f"=== {_now()} {' '.join(self.argv)}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def poll(self) -> int | None:
        return self.popen.poll() if self.popen else None

    def signal(self, sig: signal.Signals) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, sig)

    def stop(self, grace: float = 10.0) -> None:
        if self.popen is None:
            return
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(grace)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait(grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # anything left in its group


class LocalPod:
    """One pod (or a Job's pod) running locally."""

    def __init__(self, kubelet: LocalKubelet, manifest: dict[str, Any], ip: str) -> None:
        self.kubelet = kubelet
        self.manifest = manifest
        self.name: str = manifest["metadata"]["name"]
        self.ip = ip
        self.root = kubelet.workdir / "pods" / self.name
        self.volumes: dict[str, Path] = {}
        self.containers: dict[str, _Container] = {}
        self.sidecars: list[_Container] = []
        self.phase = "Pending"
        self.exit_codes: dict[str, int] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"pod-{self.name}", daemon=True)
        self.on_phase: Callable[[LocalPod], None] = lambda pod: None
        self.started_monotonic = time.monotonic()
        self.refreshed_monotonic = self.started_monotonic  # the downward-API files' last resync
        self.deadline_exceeded = False
        # The pod's thread writes the downward-API files once, the kubelet loop refreshes them:
        # one writer at a time (they share the temporary file).
        self._refresh_lock = threading.Lock()

    # ---- volumes ------------------------------------------------------------------------------
    def _make_volumes(self) -> None:
        for volume in self.manifest["spec"].get("volumes") or []:
            path = self.root / "volumes" / volume["name"]
            path.mkdir(parents=True, exist_ok=True)
            if "emptyDir" in volume or "downwardAPI" in volume:
                if "emptyDir" in volume:
                    path.chmod(0o777)
                self.volumes[volume["name"]] = path
            else:
                raise PodFailed(f"volume {volume['name']}: only emptyDir and downwardAPI here")
        self.refresh(self.manifest)

    def refresh(self, manifest: dict[str, Any]) -> None:
        """Rewrite the downward-API files from the pod's current metadata (atomically)."""
        with self._refresh_lock:
            self._write_downward_api(manifest)

    def _write_downward_api(self, manifest: dict[str, Any]) -> None:
        self.manifest["metadata"] = manifest["metadata"]
        meta = manifest["metadata"]
        for volume in self.manifest["spec"].get("volumes") or []:
            if "downwardAPI" not in volume or volume["name"] not in self.volumes:
                continue
            for item in volume["downwardAPI"].get("items") or []:
                path = (item.get("fieldRef") or {}).get("fieldPath")
                if path == "metadata.annotations":
                    text = format_map(meta.get("annotations") or {})
                elif path == "metadata.labels":
                    text = format_map(meta.get("labels") or {})
                elif path in ("metadata.name", "metadata.namespace", "metadata.uid"):
                    text = str(meta.get(path.split(".")[1], ""))
                elif path is not None and (value := _subscripted(path, meta)) is not None:
                    text = value  # the raw value, not quoted
                else:
                    continue
                target = self.volumes[volume["name"]] / item["path"]
                with contextlib.suppress(OSError):
                    if target.read_text(encoding="utf-8") == text:
                        continue
                tmp = target.with_name(f".{target.name}.tmp")
                tmp.write_text(text, encoding="utf-8")  # Go writes the string's UTF-8 bytes
                os.replace(tmp, target)

    # ---- containers ---------------------------------------------------------------------------
    def _env(
        self, container: Mapping[str, Any], base: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """The container's environment on top of `base` (default: the kubelet's base_env)."""
        meta = self.manifest["metadata"]
        env = dict(self.kubelet.base_env if base is None else base)
        env["HOSTNAME"] = self.name
        for source in container.get("envFrom") or []:
            ref = source.get("secretRef")
            if ref:
                data = self.kubelet.secret(ref["name"])
                if data is None and not ref.get("optional"):
                    raise PodFailed(f"secret {ref['name']} not found")
                env.update({source.get("prefix", "") + k: v for k, v in (data or {}).items()})
        defined: dict[str, str] = {}
        for var in container.get("env") or []:
            name = var["name"]
            if "valueFrom" in var:
                value = self._value_from(var["valueFrom"], meta)
            else:
                value = expand(str(var.get("value", "")), defined)
                value = self.kubelet.hosts.get(value, value)  # cluster DNS: pod/service names
            defined[name] = value
        env.update(defined)
        return env

    def _value_from(self, source: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            if path == "status.podIP":
                return self.ip
            if path == "spec.nodeName":
                return str(self.manifest["spec"].get("nodeName") or self.kubelet.node_of(self.name))
            if path.startswith("metadata.") and "[" not in path:
                return str(meta.get(path.split(".", 1)[1], ""))
            value = _subscripted(path, meta)
            if value is not None:
                return value
            raise PodFailed(f"fieldRef {path} is not supported here")
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = (self.kubelet.secret(ref["name"]) or {}).get(ref["key"])
            if value is None and not ref.get("optional"):
                raise PodFailed(f"secret {ref['name']} key {ref['key']} not found")
            return value or ""
        raise PodFailed(f"env source {sorted(source)} is not supported here")

    def _mounts(self, container: Mapping[str, Any], image: Image) -> list[tuple[str, Path]]:
        mounts = [
            (m["mountPath"].rstrip("/"), self.volumes[m["name"]])
            for m in container.get("volumeMounts") or []
        ]
        mounts += [(p.rstrip("/"), h) for p, h in image.files.items()]
        return sorted(mounts, key=lambda m: len(m[0]), reverse=True)

    @staticmethod
    def _translate(text: str, mounts: list[tuple[str, Path]]) -> str:
        for inside, host in mounts:
            pattern = rf"(?<![\w.-]){re.escape(inside)}(?=$|/|:)"
            text = re.sub(pattern, str(host).replace("\\", "\\\\"), text)
        return text

    def container(self, spec: Mapping[str, Any]) -> _Container:
        image = self.kubelet.images.get(spec.get("image", ""))
        if image is None:
            raise PodFailed(f"image {spec.get('image')!r} is not known to the local kubelet")
        if image.rootfs is not None:
            return self._rootfs_container(spec, image, image.rootfs)
        env = self._env(spec)
        mounts = self._mounts(spec, image)
        command = list(spec.get("command") or image.entrypoint)
        args = list(spec.get("args") or ([] if spec.get("command") else image.cmd))
        argv = [self._translate(expand(a, env), mounts) for a in [*command, *args]]
        if not argv:
            raise PodFailed(f"container {spec['name']}: no command")
        if "/" not in argv[0]:
            found = shutil.which(argv[0], path=env.get("PATH"))
            if found is None:
                raise PodFailed(f"container {spec['name']}: {argv[0]} not found on PATH")
            argv[0] = found
        env = {k: self._translate(v, mounts) for k, v in env.items()}
        workdir = spec.get("workingDir") or image.workdir
        cwd = Path(self._translate(workdir, mounts)) if workdir else self.root
        return _Container(spec["name"], argv, env, cwd, self.root / "logs" / f"{spec['name']}.log")

    def _user(self, spec: Mapping[str, Any], image: Image) -> str:
        uid, _, gid = image.user.partition(":")
        for context in (self.manifest["spec"].get("securityContext") or {},
                        spec.get("securityContext") or {}):  # fmt: skip
            uid = str(context.get("runAsUser", uid))
            gid = str(context.get("runAsGroup", gid))
        return f"{uid}:{gid or uid}"

    def _rootfs_container(self, spec: Mapping[str, Any], image: Image, rootfs: Path) -> _Container:
        """The container in the image's own files (perfdiag_testing.rootfs_run)."""
        user = self._user(spec, image)
        env = self._env(spec, {**image.env, "HOME": _home(rootfs, user.split(":")[0])})
        command = list(spec.get("command") or image.entrypoint)
        args = list(spec.get("args") or ([] if spec.get("command") else image.cmd))
        argv = [expand(a, env) for a in [*command, *args]]
        if not argv:
            raise PodFailed(f"container {spec['name']}: no command")
        launcher = [
            sys.executable, "-I", "-m", "perfdiag_testing.rootfs_run",
            "--rootfs", str(rootfs),
            "--scratch", str(self.root / "rootfs" / spec["name"]),
            "--user", user,
            "--workdir", spec.get("workingDir") or image.workdir or "/",
        ]  # fmt: skip
        for mount in spec.get("volumeMounts") or []:
            host = str(self.volumes[mount["name"]]) + (":ro" if mount.get("readOnly") else "")
            launcher += ["--mount", f"{mount['mountPath']}={host}"]
        log_path = self.root / "logs" / f"{spec['name']}.log"
        return _Container(spec["name"], [*launcher, "--", *argv], env, self.root, log_path)

    def _run(self) -> None:
        try:
            self._make_volumes()
            spec = self.manifest["spec"]
            for init in spec.get("initContainers") or []:
                proc = self.container(init)
                self.containers[proc.name] = proc
                proc.start()
                if init.get("restartPolicy") == "Always":
                    self.sidecars.append(proc)
                    continue
                code = proc.popen.wait() if proc.popen else 1
                self.exit_codes[proc.name] = code
                if code != 0:
                    raise PodFailed(f"init container {proc.name} exited with {code}")
            mains = [self.container(c) for c in spec["containers"]]
            for proc in mains:
                self.containers[proc.name] = proc
                proc.start()
            self._set_phase("Running")
            while not self.stopping.is_set():
                self._restart_sidecars()
                if all(p.poll() is not None for p in mains):
                    break
                time.sleep(0.2)
            for proc in mains:
                proc.stop()
                returned = proc.poll()
                self.exit_codes[proc.name] = returned if returned is not None else -9
            for proc in reversed(self.sidecars):
                proc.stop()
            ok = all(self.exit_codes[p.name] == 0 for p in mains)
            self._set_phase("Succeeded" if ok and not self.stopping.is_set() else "Failed")
        except Exception as exc:
            if isinstance(exc, PodFailed):
                log.warning("pod %s failed: %s", self.name, exc)
                why = str(exc)
            else:
                log.exception("pod %s: kubelet error", self.name)
                why = traceback.format_exc()
            (self.root / "logs").mkdir(parents=True, exist_ok=True)
            (self.root / "logs" / f"{KUBELET_LOG}.log").write_text(why)
            for proc in self.containers.values():
                proc.stop()
            self._set_phase("Failed")

    def _restart_sidecars(self) -> None:
        for proc in self.sidecars:
            if proc.poll() is not None and not proc.keep_dead:
                proc.restarts += 1
                proc.start()

    def _set_phase(self, phase: str) -> None:
        self.phase = phase
        try:
            self.on_phase(self)
        except Exception:
            log.exception("pod %s: reporting phase %s failed", self.name, phase)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        for proc in self.containers.values():
            proc.stop()
        self.thread.join(30)

    def kill(self, container: str, *, restart: bool = True) -> None:
        """SIGKILL one container (a crash); with restart=False a sidecar stays dead."""
        proc = self.containers[container]
        proc.keep_dead = not restart
        proc.signal(signal.SIGKILL)

    def log_text(self, container: str) -> str:
        path = self.root / "logs" / f"{container}.log"
        return path.read_text(errors="replace") if path.exists() else ""


class LocalKubelet:
    """Runs the pods and Jobs of `namespace` as local processes until stopped."""

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        workdir: Path,
        images: Mapping[str, Image],
        base_env: Mapping[str, str],
        *,
        poll_s: float = 0.3,
        first_address: int = 2,
        node_of: Callable[[str], str] | None = None,
        downward_api_resync_s: float | None = None,
    ) -> None:
        """`node_of`: the node a pod (by name) runs on, its spec.nodeName where the manifest
        has none (no scheduler here); one node, "local-node", by default.
        `downward_api_resync_s`: refresh a pod's downward-API files only every that many
        seconds from its start (a real kubelet's periodic resync, when its event-driven
        remount misses an update); None: at every sync (`poll_s`)."""
        import kubernetes

        self.core: Any = kubernetes.client.CoreV1Api(api_client)
        self.batch: Any = kubernetes.client.BatchV1Api(api_client)
        self.namespace = namespace
        self.workdir = workdir
        self.images = dict(images)
        self.base_env = dict(base_env)
        self.poll_s = poll_s
        self.downward_api_resync_s = downward_api_resync_s
        self.pods: dict[str, LocalPod] = {}
        self.jobs: dict[str, LocalPod] = {}
        self.job_attempts: dict[str, int] = {}
        self.hosts: dict[str, str] = {}
        self.node_of = node_of or (lambda _pod: "local-node")
        self.hold_jobs = False  # True: new Jobs wait (as if no node could take their pod yet)
        self._next_address = first_address
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="local-kubelet", daemon=True)

    # ---- API reads ----------------------------------------------------------------------------
    def _list(self, call: Callable[..., Any]) -> list[dict[str, Any]]:
        response = call(self.namespace, _preload_content=False)
        items: list[dict[str, Any]] = json.loads(response.data)["items"]
        return items

    def secret(self, name: str) -> dict[str, str] | None:
        try:
            response = self.core.read_namespaced_secret(
                name, self.namespace, _preload_content=False
            )
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise
        data = json.loads(response.data).get("data") or {}
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    # ---- loop ---------------------------------------------------------------------------------
    def start(self) -> LocalKubelet:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for pod in [*self.pods.values(), *self.jobs.values()]:
            pod.stop()

    def __enter__(self) -> LocalKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync_pods()
                self._sync_jobs()
            except Exception:
                log.exception("local kubelet: sync failed")
            self._stop.wait(self.poll_s)

    def _address(self) -> str:
        address = f"127.0.0.{self._next_address}"
        self._next_address += 1
        return address

    def _sync_pods(self) -> None:
        pods = self._list(self.core.list_namespaced_pod)
        live = {
            p["metadata"]["name"]: p for p in pods if not p["metadata"].get("deletionTimestamp")
        }
        new = [p for name, p in sorted(live.items()) if name not in self.pods]
        for manifest in new:  # addresses first, so every new pod can resolve the others
            self.hosts[manifest["metadata"]["name"]] = self._address()
        for manifest in new:
            name = manifest["metadata"]["name"]
            pod = LocalPod(self, manifest, self.hosts[name])
            pod.on_phase = self._report_pod
            self.pods[name] = pod
            pod.start()
        for name, pod in self.pods.items():
            if name in live:
                if pod.phase in ("Pending", "Running") and self._resync_due(pod):
                    pod.refresh(live[name])
            elif not pod.stopping.is_set():
                threading.Thread(target=pod.stop, daemon=True).start()

    def _resync_due(self, pod: LocalPod) -> bool:
        """Whether the pod's downward-API files follow its metadata at this sync."""
        if self.downward_api_resync_s is None:
            return True
        due = time.monotonic() - pod.refreshed_monotonic >= self.downward_api_resync_s
        if due:
            pod.refreshed_monotonic = time.monotonic()
        return due

    def _report_pod(self, pod: LocalPod) -> None:
        status: dict[str, Any] = {"phase": pod.phase, "podIP": pod.ip, "podIPs": [{"ip": pod.ip}]}
        if pod.phase == "Running":
            status["startTime"] = _now()
        try:
            self.core.patch_namespaced_pod_status(
                pod.name, self.namespace, {"status": status}, _preload_content=False
            )
        except Exception as exc:  # a deleted pod; anything else shows in the test's log
            log.warning("pod %s: status not written: %s", pod.name, exc)

    def _sync_jobs(self) -> None:
        jobs = {j["metadata"]["name"]: j for j in self._list(self.batch.list_namespaced_job)}
        for name, job in jobs.items():
            if name in self.jobs or job["metadata"].get("deletionTimestamp") or self.hold_jobs:
                continue
            conditions = (job.get("status") or {}).get("conditions") or []
            if any(c["type"] in ("Complete", "Failed") for c in conditions):
                continue
            self._start_job_pod(job)
        for name, pod in list(self.jobs.items()):
            current = jobs.get(name)
            if current is None or current["metadata"].get("deletionTimestamp"):
                if not pod.stopping.is_set():
                    threading.Thread(target=pod.stop, daemon=True).start()
                continue
            deadline = current["spec"].get("activeDeadlineSeconds")
            if deadline and time.monotonic() - pod.started_monotonic > deadline:
                pod.deadline_exceeded = True
                threading.Thread(target=pod.stop, daemon=True).start()

    def _start_job_pod(self, job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        attempt = self.job_attempts.get(name, 0)
        self.job_attempts[name] = attempt + 1
        template = json.loads(json.dumps(job["spec"]["template"]))
        meta = {
            **(template.get("metadata") or {}),
            "name": f"{name}-{attempt}",
            "namespace": self.namespace,
            "uid": f"{job['metadata']['uid']}-{attempt}",
        }
        pod = LocalPod(self, {"metadata": meta, "spec": template["spec"]}, self._address())
        pod.on_phase = functools.partial(self._report_job, name)
        self.jobs[name] = pod
        if attempt == 0:
            self._patch_job(name, {"startTime": _now(), "active": 1})
        pod.start()

    def _report_job(self, name: str, pod: LocalPod) -> None:
        if pod.phase == "Running":
            return
        try:
            job = self.batch.read_namespaced_job(name, self.namespace, _preload_content=False)
        except Exception:
            return  # deleted
        job = json.loads(job.data)
        now = _now()
        if pod.phase == "Succeeded":
            self._patch_job(
                name,
                {
                    "active": 0,
                    "succeeded": 1,
                    "completionTime": now,
                    "conditions": [
                        _condition("SuccessCriteriaMet", "CompletionsReached", "", now),
                        _condition("Complete", "CompletionsReached", "", now),
                    ],
                },
            )
            return
        attempts = self.job_attempts.get(name, 1)
        if pod.deadline_exceeded:
            reason, message = "DeadlineExceeded", "Job was active longer than specified deadline"
        elif attempts <= int(job["spec"].get("backoffLimit", 6)) and not pod.stopping.is_set():
            self._patch_job(name, {"active": 1, "failed": attempts})
            del self.jobs[name]  # the next sync starts a new attempt
            return
        else:
            reason, message = "BackoffLimitExceeded", "Job has reached the specified backoff limit"
        self._patch_job(
            name,
            {
                "active": 0,
                "failed": attempts,
                "conditions": [
                    _condition("FailureTarget", reason, message, now),
                    _condition("Failed", reason, message, now),
                ],
            },
        )

    def _patch_job(self, name: str, status: dict[str, Any]) -> None:
        try:
            self.batch.patch_namespaced_job_status(
                name, self.namespace, {"status": status}, _preload_content=False
            )
        except Exception as exc:  # a deleted Job; anything else shows in the test's log
            log.warning("job %s: status not written: %s", name, exc)


def _home(rootfs: Path, uid: str) -> str:
    """The home folder of `uid` in the image's /etc/passwd ("/" when it has none)."""
    with contextlib.suppress(OSError):
        for line in (rootfs / "etc" / "passwd").read_text().splitlines():
            fields = line.split(":")
            if len(fields) >= 6 and fields[2] == uid:
                return fields[5]
    return "/"


def _condition(type_: str, reason: str, message: str, now: str) -> dict[str, str]:
    return {
        "type": type_,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastProbeTime": now,
        "lastTransitionTime": now,
    }
