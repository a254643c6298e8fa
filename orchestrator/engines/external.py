"""The ``external`` engine: measure an OpenAI-compatible endpoint that already runs.

Nothing is deployed or torn down: "deploy" checks that ``engine.base_url`` answers
``GET /v1/models`` (within ``start_timeout_s``) and takes the served model's id from
it unless ``engine.model_name`` names one. The search space then only documents the
configuration the endpoint runs (or is one point: any server, vLLM or not); the
interesting knobs are the workload's, e.g. a capacity search.

The API key is read from the environment variable ``engine.api_key_env`` when the
trial runs; it is sent only in the ``Authorization`` header, scrubbed from error
texts (:meth:`orchestrator.loadgen.Endpoint.scrub`), and never written to a row,
a log line or the study definition (which holds the variable's name only).
Credentials inside ``base_url`` (``https://user:pass@host``) are refused when the
study is loaded, so that no recorded URL can carry one.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Optional

from orchestrator.engines.base import Deployment, Engine, EngineEndpoint, ResourceRequest
from orchestrator.failures import EngineStartError, FailureKind
from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.redaction import join_url

__all__ = ["ExternalEngine"]


class _ExternalDeployment(Deployment):
    def __init__(self, endpoint: EngineEndpoint):
        self.endpoint = endpoint

    def health(self) -> Optional[str]:
        try:
            _get_json(join_url(self.endpoint.base_url, "/v1/models"), self.endpoint.api_key, timeout_s=10)
            return None
        except _Unreachable as e:
            return f"endpoint stopped answering: {e}"

    def __exit__(self, *exc) -> None:
        return None  # not ours to stop


class _Unreachable(Exception):
    pass


def _get_json(url: str, api_key: Optional[str], timeout_s: float) -> dict:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise _Unreachable(f"HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise _Unreachable(f"{type(e).__name__}: {getattr(e, 'reason', e)}") from None


class ExternalEngine(Engine):
    kind = "external"
    deploys_on_serve = False  # a study of an endpoint elsewhere starts no Serve controller or proxy

    def resolve(self, args: EngineArgs) -> EngineArgs:
        return args  # the endpoint's own configuration is whatever it runs: nothing to fill in

    def resources(self, args: EngineArgs) -> ResourceRequest:
        return ResourceRequest("GPU", 0)  # nothing is deployed here

    def api_key(self) -> Optional[str]:
        var = self.target.engine.api_key_env
        if var is None:
            return None
        key = os.environ.get(var)
        if not key:
            raise EngineStartError(FailureKind.INVALID_ARGS,
                                   f"engine.api_key_env names {var}, which is not set in the trial's environment")
        return key

    def deploy(self, trial_id: str, args: EngineArgs) -> Deployment:
        spec = self.target.engine
        key = self.api_key()
        base = shown = spec.base_url.rstrip("/")
        t0 = time.monotonic()
        deadline = t0 + spec.start_timeout_s
        last = "no attempt made"
        while True:
            try:
                models = _get_json(join_url(base, "/v1/models"), key, timeout_s=10)
                break
            except _Unreachable as e:
                last = str(e)
                if key:
                    last = last.replace(key, "***")
            if time.monotonic() >= deadline:
                raise EngineStartError(FailureKind.START_TIMEOUT,
                                       f"{join_url(shown, '/v1/models')} did not answer within {spec.start_timeout_s:.0f} s: {last}")
            time.sleep(0.5)
        ids = [m.get("id") for m in models.get("data", []) if isinstance(m, dict) and m.get("id")]
        model = spec.model_name or (ids[0] if ids else None)
        if model is None:
            raise EngineStartError(FailureKind.INVALID_ARGS,
                                   f"{join_url(shown, '/v1/models')} lists no model; set engine.model_name")
        if spec.model_name and ids and spec.model_name not in ids:
            raise EngineStartError(FailureKind.INVALID_ARGS,
                                   f"{shown} does not serve {spec.model_name!r}; it serves: {', '.join(ids)}")
        endpoint = EngineEndpoint(base_url=base, model=model, metrics_url=spec.metrics_url,
                                  startup_s=time.monotonic() - t0, api_key=key,
                                  facts={"served_models": ids, "endpoint": shown})
        return _ExternalDeployment(endpoint)

