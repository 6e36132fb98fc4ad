"""torch.profiler for one capture window: start, stop, export the Kineto Chrome trace.

Started and stopped on the training thread (the Kineto profiler state belongs to the thread
that enabled it). Works on torch 2.1 … 2.15: the start goes through the public
`torch.profiler.profile`; the stop takes the Kineto result straight from
`torch.autograd.profiler._disable_profiler()` and saves it (the C++ writer), which skips the
eager Python post-processing of every event that `profile.stop()` does on older torch
versions; the public `stop()` + `export_chrome_trace()` is the fallback when that private
function is missing or a profiler feature needs the public path. See docs/hook.md for timings.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

EXPORT_KINETO_SAVE = "kineto_result_save"
EXPORT_PUBLIC = "export_chrome_trace"


class ProfilerBusy(RuntimeError):
    """Another profiler is already recording in this process (the user's own, typically)."""


def profiler_enabled() -> bool:
    """Whether any torch profiler (Kineto or legacy) is recording on this thread."""
    import torch

    enabled = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", None)
    return bool(enabled()) if enabled is not None else False


class ProfilerSession:
    """One torch.profiler recording. Every method runs on the thread that called start()."""

    def __init__(self, cuda: bool, python_stacks: bool) -> None:
        self.cuda = cuda
        self.python_stacks = python_stacks
        self._profile: Optional[Any] = None

    def start(self) -> None:
        import torch

        if profiler_enabled():
            raise ProfilerBusy("another torch profiler is already recording in this process")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the training's output stays the user's own
            profile = torch.profiler.profile(
                activities=activities, with_stack=self.python_stacks, record_shapes=False
            )
            self._profile = profile  # set first: abort() must stop a half-started profiler
            profile.start()

    def stop_and_export(self, path: str) -> str:
        """Stop recording and write the Chrome trace to `path`; returns the export path used."""
        profile, self._profile = self._profile, None
        if profile is None:
            raise RuntimeError("the profiler was not started")
        fast = (
            _private_disable() is not None
            and getattr(profile, "profiler", None) is not None
            and getattr(profile, "execution_trace_observer", None) is None
            and not getattr(profile, "_use_cuspy", False)
        )
        if fast:
            if self.cuda:
                import torch

                torch.cuda.synchronize()  # what profile.stop() does: the last kernels land
            _disable_kineto().save(path)
            return EXPORT_KINETO_SAVE
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            profile.stop()
            profile.export_chrome_trace(path)
        return EXPORT_PUBLIC

    def abort(self) -> None:
        """Stop recording, discarding the events; never raises."""
        profile, self._profile = self._profile, None
        if profile is None:
            return
        try:
            if not profiler_enabled():
                return
            if _private_disable() is None:
                profile.stop()
            else:
                _disable_kineto()
        except Exception:
            pass


def _private_disable() -> Any:
    from torch.autograd import profiler as autograd_profiler

    return getattr(autograd_profiler, "_disable_profiler", None)


def _disable_kineto() -> Any:
    """Disable the profiler of this thread; its Kineto result (with `.save(path)`)."""
    from torch.autograd import profiler as autograd_profiler

    result = autograd_profiler._disable_profiler()  # type: ignore[attr-defined]
    on_stop: Any = getattr(autograd_profiler, "_run_on_profiler_stop", None)
    if on_stop is not None:
        on_stop()  # clears torch's Python-side "profiler enabled" flag (torch ≥ 2.4)
    return result
