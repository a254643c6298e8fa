"""Deploying and deleting one trial's Ray Serve application, with bounded waits.

``serve.run`` blocks until healthy with no timeout and raises on failure with a
generic message; a tuner needs a start timeout and the replica's own error text to
classify the failure, so the app is submitted without blocking and its status is
polled here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional

from orchestrator.engines.base import Deployment, EngineEndpoint
from orchestrator.failures import EngineStartError, FailureKind, classify_start_error, engine_message

log = logging.getLogger(__name__)

# The Serve HTTP proxy trials talk to (a proxy runs on every node by default).


def app_name_for(trial_id: str) -> str:
    return f"tune-{trial_id}"


def submit_app(app, *, name: str, route_prefix: str) -> None:
    """Submit without waiting (Ray's internal ``_run`` with ``_blocking=False``)."""
    from ray import serve
    from ray.serve import api as serve_api

    run = getattr(serve_api, "_run", None)
    if run is not None:
        run(app, _blocking=False, name=name, route_prefix=route_prefix)
    else:  # pragma: no cover - older/newer Ray without _run
        serve.run(app, name=name, route_prefix=route_prefix)


@dataclass(frozen=True)
class AppState:
    """One application's state as Serve's controller reports it."""

    status: str  # Serve's ApplicationStatus: DEPLOYING, RUNNING, DEPLOY_FAILED, UNHEALTHY, DELETING
    message: str
    deployments: dict[str, tuple[str, str]]  # deployment name -> (DeploymentStatus, message)

    def failure_text(self) -> str:
        return "\n".join(m for m in (self.message, *(msg for _, msg in self.deployments.values())) if m)


def _value(enum_or_str) -> str:
    return str(getattr(enum_or_str, "value", enum_or_str))


def app_state(name: str) -> Optional[AppState]:
    """The application's state, or None when Serve does not know it (never deployed, or deleted).

    Asks the controller for this one application. ``serve.status()`` builds every application's
    details and, per call, cloudpickles each deployment's request router: about 0.2 CPU-s a call
    in the trial's process, polled every half second while a replica starts."""
    from ray.serve.context import _get_global_client  # no public API for one application's status

    client = _get_global_client(raise_if_no_controller_running=False)
    if client is None:
        return None
    overview = client.get_serve_status(name)
    status = _value(overview.app_status.status)
    if status == "NOT_STARTED":
        return None
    return AppState(status, overview.app_status.message or "",
                    {d.name: (_value(d.status), d.message or "") for d in overview.deployment_statuses})


def wait_until_running(name: str, *, timeout_s: float, poll_s: float = 0.5,
                       on_wait: Optional[Callable[[float], None]] = None, since: Optional[float] = None) -> float:
    """Wait for the app to be RUNNING; return seconds waited. Raise EngineStartError otherwise.
    ``since``: when the wait began (``time.monotonic()``), if earlier than now."""
    t0 = time.monotonic() if since is None else since
    last = None
    while True:
        elapsed = time.monotonic() - t0
        st = app_state(name)
        if st is not None:
            last = st
            if st.status == "RUNNING":
                return elapsed
            if st.status in ("DEPLOY_FAILED", "UNHEALTHY"):
                text = st.failure_text()
                raise EngineStartError(classify_start_error(text), engine_message(text))
        if elapsed > timeout_s:
            detail = last.failure_text() if last is not None else "application never appeared"
            raise EngineStartError(FailureKind.START_TIMEOUT,
                                   f"not ready after {timeout_s:.0f} s: {engine_message(detail) if detail else ''}".strip())
        if on_wait is not None:
            on_wait(elapsed)
        time.sleep(poll_s)


# Ray's words for a replica it cancelled before its constructor ran (a busy or changing cluster):
# nothing is known about the configuration, so its start is tried once more.
NEVER_RAN = "The actor never ran"


def start_app(app, *, name: str, route_prefix: Optional[str], timeout_s: float, poll_s: float = 0.5) -> float:
    """:func:`submit_app`, then :func:`wait_until_running` within ``timeout_s`` (a retry included);
    return the seconds waited. A deployment that failed only because Ray cancelled its replica before the
    replica ran is deleted and submitted once more (its verdict would otherwise be that
    cancellation's, a ``start_crash``, whatever the configuration)."""
    since = None  # the first attempt's wait: a retry waits within what is left of it
    for attempt in (1, 2):
        submit_app(app, name=name, route_prefix=route_prefix)
        since = time.monotonic() if since is None else since
        try:
            return wait_until_running(name, timeout_s=timeout_s, poll_s=poll_s, since=since)
        except EngineStartError as e:
            if attempt == 2 or e.kind == FailureKind.START_TIMEOUT or NEVER_RAN not in e.message:
                raise
            log.warning("%s: Ray cancelled its replica before it ran; deploying it once more", name)
            delete_app(name, timeout_s=60)
    raise AssertionError("unreachable")


def delete_app(name: str, *, timeout_s: float = 120) -> Optional[str]:
    """Delete the app and wait until it is gone; return a problem description or None."""
    from ray import serve

    t0 = time.monotonic()
    try:
        serve.delete(name, _blocking=False)
    except Exception as e:  # noqa: BLE001 - report, never raise from teardown
        return f"serve.delete failed: {e}"
    while time.monotonic() - t0 < timeout_s:
        try:
            if app_state(name) is None:
                return None
        except Exception as e:  # noqa: BLE001
            return f"serve.status failed during teardown: {e}"
        time.sleep(0.1)
    return f"application {name} still present {timeout_s:.0f} s after delete"


def app_messages(name: str) -> str:
    """Serve's status messages for an application (why its replica died or was replaced), or ""."""
    try:
        st = app_state(name)
        return st.failure_text()[-2000:] if st is not None else ""
    except Exception:  # noqa: BLE001
        return ""


def knows_label_selector() -> bool:
    """Ray >= 2.49 places replicas by node label; older Serve rejects the option."""
    try:
        from ray.serve.schema import RayActorOptionsSchema

        return "label_selector" in RayActorOptionsSchema.model_fields
    except Exception:  # noqa: BLE001
        return False


class AppDeployment(Deployment):
    """A deployment that is one Serve application: leaving it deletes the application and
    waits until Serve no longer lists it."""

    def __init__(self, name: str, endpoint: EngineEndpoint, teardown_timeout_s: float):
        self.name = name
        self.endpoint = endpoint
        self.teardown_timeout_s = teardown_timeout_s
        self._problems: list[str] = []

    def teardown_problems(self) -> list[str]:
        return self._problems

    def __exit__(self, *exc) -> None:
        problem = delete_app(self.name, timeout_s=self.teardown_timeout_s)
        if problem:
            self._problems.append(problem)
