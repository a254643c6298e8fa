"""The served sim's Ray Serve deployment: FastAPI routes over :mod:`orchestrator.engines.sim.http_server`'s
front end, plus the replica's direct server (``transport: direct``)."""

import asyncio
import time

import ray
from fastapi import Request  # a real annotation object below: Ray versions resolve string ones differently
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from ray import serve

from orchestrator.engines.sim.faults import Fault, LoadFaults, act_on_start, ingress_delay_s
from orchestrator.engines.sim.http_server import NOT_JSON, build_sim_frontend, error_body, start_direct_server


# At module level, so that a deploy pickles the class by reference (module and name): a class made
# inside a function is pickled by value, its FastAPI app and every method's globals with it, which
# cost each trial about a CPU-second (cloudpickle walks sys.modules per method).
api = FastAPI()


@serve.ingress(api)
class SimLLMServer:
    def __init__(self, *, startup_s: float = 0.0, direct: bool = True, faults: tuple = (), **kwargs):

        t0 = time.monotonic()
        injected = [Fault(**f) for f in faults]
        act_on_start(injected)
        self.front = build_sim_frontend(**kwargs)
        self.front.chunk_delay_s = ingress_delay_s(injected)
        self.direct_url = None
        if direct:
            port = asyncio.run_coroutine_threadsafe(start_direct_server(self.front), self.front.rt.loop)
            self.direct_url = f"http://127.0.0.1:{port.result(timeout=30)}"
            self.node_ip = ray.util.get_node_ip_address()
        if startup_s > 0:
            time.sleep(max(0.0, startup_s - (time.monotonic() - t0)))
        self.load_faults = LoadFaults(injected, oom=self.front.rt.inject_failure)
        self.front.rt.on_accept = self.load_faults.on_request

    @api.get("/health")
    async def health(self):
        error = self.front.health_error()
        return Response(status_code=200) if error is None else JSONResponse(error, status_code=500)

    @api.get("/v1/models")
    async def models(self):
        return JSONResponse(self.front.models_body())

    @api.get("/version")
    async def version(self):
        return JSONResponse(self.front.version_body())

    async def _complete(self, request: Request, chat: bool):
        try:
            body = await request.json()
        except Exception:  # noqa: BLE001
            return JSONResponse(error_body(400, NOT_JSON), status_code=400)
        status, answer = await self.front.respond(body, chat)
        if isinstance(answer, dict):
            return JSONResponse(answer, status_code=status)
        return StreamingResponse(answer, media_type="text/event-stream")

    @api.post("/v1/completions")
    async def completions(self, request: Request):
        return await self._complete(request, chat=False)

    @api.post("/v1/chat/completions")
    async def chat(self, request: Request):
        return await self._complete(request, chat=True)

    @api.get("/metrics")
    async def metrics(self):
        return PlainTextResponse(self.front.metrics_text())

    @api.get("/engine_facts")
    async def engine_facts(self):
        return JSONResponse({**self.front.facts(), "direct_url": self.direct_url,
                             "node_ip": getattr(self, "node_ip", None),
                             "node_id": ray.get_runtime_context().get_node_id()})

    def check_health(self):
        if self.front.rt.error is not None:
            raise RuntimeError(f"engine loop died: {self.front.rt.error!r}")
