"""The Ray executor: pack's and the read passes' tasks as Ray tasks (``--executor ray``).

``ray`` joins the Ray instance this process already started (``ray.init``), else starts a local
one for the job (and stops it after); ``ray://HOST:PORT`` connects to a running cluster through
Ray Client. Ray re-runs a task whose worker died (``max_retries``) and a task that failed on a
transient store fault; a task that raised anything else (a bad record, a corrupt payload) fails
once and reports its own exception, not Ray's wrapper with the remote traceback.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable
from typing import Any

from ..errors import TransientStoreError, UsageError

__all__ = ["RAY_RETRIES", "RayExecutor", "is_ray", "join_ray", "task_error"]

# Re-runs of a task whose worker died or whose store fault outlasted the store's own retries.
RAY_RETRIES = 2


def is_ray(spec: object) -> bool:
    return isinstance(spec, str) and (spec == "ray" or spec.startswith("ray://"))


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise UsageError(
            "a ray executor needs the 'ray' extra (pip install 'shardlake[ray]')",
            options=("executor",),
        ) from exc
    return ray


def join_ray(spec: str, workers: int | None) -> tuple[Any, bool]:
    """``(ray, started)``: Ray initialised for ``spec``; ``started``: this call started it."""
    ray = _import_ray()
    if ray.is_initialized():
        return ray, False
    address = spec if spec.startswith("ray://") else None
    try:
        if address is not None:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    except (ConnectionError, OSError, RuntimeError) as exc:
        raise UsageError(
            f"executor {spec}: cannot start or reach Ray ({exc})", options=("executor",)
        ) from exc
    return ray, True


def task_error(exc: BaseException) -> BaseException:
    """The exception a Ray task raised itself (not Ray's wrapper, whose text is the remote
    traceback), or a one-line error for a worker Ray lost."""
    current = exc
    for _ in range(8):  # Ray Data wraps a task's error in a RayTaskError and a UserCodeException
        cause = getattr(current, "cause", None)  # RayTaskError keeps the task's exception here
        if isinstance(cause, BaseException) and cause is not current:
            current = cause
        elif _is_ray_error(current) and current.__cause__ is not None:
            current = current.__cause__
        else:
            break
    name = type(current).__name__
    if name in ("WorkerCrashedError", "NodeDiedError", "ActorDiedError"):
        return RuntimeError(f"Ray worker died ({name})")
    return current


def _is_ray_error(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] == "ray"


class RayExecutor(cf.Executor):
    """A :class:`concurrent.futures.Executor` whose tasks run as Ray tasks."""

    def __init__(self, spec: str = "ray", workers: int | None = None) -> None:
        self._ray, self._started = join_ray(spec, workers)
        self._remote: dict[Callable[..., Any], Any] = {}

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._ray.remote(
                max_retries=RAY_RETRIES, retry_exceptions=[TransientStoreError]
            )(fn)
            self._remote[fn] = remote
        ray_future = remote.remote(*args, **kwargs).future()
        future: cf.Future[Any] = cf.Future()
        future.set_running_or_notify_cancel()

        def settle(done: cf.Future[Any]) -> None:
            try:
                future.set_result(done.result())
            except BaseException as exc:  # noqa: BLE001 - delivered through the future
                future.set_exception(self._unwrap(exc))

        ray_future.add_done_callback(settle)
        return future

    def _unwrap(self, exc: BaseException) -> BaseException:
        return task_error(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False
