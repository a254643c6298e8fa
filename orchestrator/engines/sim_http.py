"""The simulated engine's HTTP front end: an OpenAI-compatible streaming server in a Ray Serve replica.

The engine (:mod:`orchestrator.engines.sim_loop`: the simulator core stepping in real
time) runs on its own thread and event loop, like vLLM's engine core beside its API
server. :class:`OpenAIFrontend` parses requests and writes responses once; two HTTP
front doors serve it:

* the Serve ingress (FastAPI routes behind Ray Serve's proxy), and
* a direct aiohttp server in the replica (``transport: direct``). Serve's proxy
  moves each streamed chunk as a Ray object, a few hundred chunks per second on
  a small machine, far below what a simulated H100 emits; measuring through it
  would measure the proxy. The direct door is how vLLM's own API server is
  reached, and costs tens of microseconds per chunk.

Routes: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions`` (SSE or
JSON), ``/health``, ``/metrics`` (Prometheus text with vLLM's metric names: its
gauges, counters and request-latency histograms, see
:mod:`orchestrator.engines.sim_metrics`) and ``/engine_facts``.
"""

import asyncio
import json
import threading
import time
from typing import Any, AsyncIterator, Optional

from aiohttp import web
from fastapi import Request  # a real annotation object below: Ray versions resolve string ones differently
from pydantic import TypeAdapter, ValidationError

from orchestrator.engine_args import EngineArgs
from orchestrator.engines.sim_loop import FINISHED, Mailbox, SimRuntime
from orchestrator.engines.sim_metrics import metrics_text
from orchestrator.sim.core import SimEngineCore
from orchestrator.sim.hardware import get_gpu
from orchestrator.sim.models import ModelShape
from orchestrator.workload.generate import text_token_ids

NOT_JSON = "request body is not JSON"


def words_to_ids(text: str, vocab_size: int) -> list[int]:
    """Text prompts: word ``t123`` is token 123 (the workload's encoding); other words hash."""
    return list(text_token_ids(text, vocab_size))


class BadRequest(ValueError):
    """A request vLLM's server refuses, with its status, error type and parameter (vLLM's ``ErrorInfo``)."""

    def __init__(self, message: str, *, param: Optional[str] = None, status: int = 400,
                 err_type: str = "BadRequestError"):
        super().__init__(message)
        self.param, self.status, self.err_type = param, status, err_type

    def body(self) -> dict:
        return error_body(self.status, str(self), self.err_type, self.param)


_OPTIONAL_INT = TypeAdapter(Optional[int])


def _int_field(body: dict, name: str) -> Optional[int]:
    """``body[name]`` as vLLM's request model reads an ``int | None`` field (pydantic, lax), or the
    400 its request validation answers (type ``Bad Request``, param ``body.<name>``)."""
    try:
        return _OPTIONAL_INT.validate_python(body.get(name))
    except ValidationError as e:
        errors = [{**err, "loc": ("body", name, *err["loc"])} for err in e.errors(include_url=False)]
        label = "error" if len(errors) == 1 else "errors"
        message = f"{len(errors)} validation {label}:\n" + "".join(f"  {err}\n" for err in errors)
        raise BadRequest(message.rstrip(), param=f"body.{name}", err_type="Bad Request") from None


class OpenAIFrontend:
    """Request parsing and response bodies, written once for both HTTP front doors."""

    def __init__(self, runtime: SimRuntime, model: ModelShape, args: EngineArgs, served_model_name: str):
        self.rt = runtime
        self.model = model
        self.args = args
        self.name = served_model_name
        self.created = int(time.time())
        # Fault ``ingress_delay``: a serving path that moves one streamed chunk at a time, each
        # taking this long (0: none). See orchestrator.engines.sim_faults.
        self.chunk_delay_s = 0.0
        self._ingress_lock = threading.Lock()
        self._ingress_free_at = 0.0

    def models_body(self) -> dict:
        return {"object": "list", "data": [{"id": self.name, "object": "model", "created": self.created,
                                            "owned_by": "orchestrator-sim", "max_model_len": self.args.max_model_len}]}

    def _prompt_ids(self, body: dict, chat: bool) -> list[int]:
        v = self.model.vocab_size
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise BadRequest("'messages' must be a non-empty list")
            return words_to_ids(" ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict)), v)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return [t % v for t in prompt]
        if isinstance(prompt, str) and prompt:
            return words_to_ids(prompt, v)
        raise BadRequest("'prompt' must be a non-empty string or list of token ids")

    async def start(self, body: Any, chat: bool):
        """Validate and submit; returns (rid, mailbox) or raises BadRequest (vLLM's status and error body)."""
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        # In vLLM's order: the request model's types, the model name, then SamplingParams' values.
        fields = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens", "max_completion_tokens")
        limits = [_int_field(body, f) for f in fields]
        n = _int_field(body, "n")
        if body.get("model") not in (None, self.name):
            raise BadRequest(f"The model `{body.get('model')}` does not exist.", param="model", status=404,
                             err_type="NotFoundError")
        ids = self._prompt_ids(body, chat)
        max_tokens = next((v for v in limits if v is not None), 16)  # 16: vLLM's default
        if n is not None and n < 1:
            raise BadRequest(f"n must be at least 1, got {n}.")
        if n is not None and n > 1:  # vLLM samples n sequences; the simulator makes one: refuse, never ignore
            raise BadRequest(f"n > 1 is not supported by the simulated engine (one sequence per request), "
                             f"got {n}.", param="n")
        if max_tokens < 1:
            raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}. "
                             f"(parameter=max_tokens, value={max_tokens})", param="max_tokens")
        rid, box, accepted = self.rt.submit(ids, max_tokens)
        try:
            await accepted
        except ValueError as e:  # the core refused it (e.g. longer than max_model_len): vLLM answers 400
            raise BadRequest(str(e)) from None
        return rid, box

    async def respond(self, body: Any, chat: bool) -> tuple[int, Any]:
        """A completion request's answer, the same through either door: ``(status, JSON body)``,
        or ``(200, SSE chunks)`` (an async iterator of bytes) for a streamed one."""
        try:
            rid, box = await self.start(body, chat)
        except BadRequest as e:
            return e.status, e.body()
        except RuntimeError as e:  # the engine is dead
            return 500, error_body(500, str(e))
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return 200, self.sse(rid, box, chat, include_usage)
        try:
            return 200, await self.full(rid, box, chat)
        except RuntimeError as e:
            return 500, error_body(500, str(e))

    def health_error(self) -> Optional[dict]:
        """None while the engine loop runs, else the body of ``/health``'s 500."""
        return None if self.rt.error is None else error_body(500, f"engine dead: {self.rt.error!r}")

    async def tokens(self, rid: str, box: Mailbox) -> AsyncIterator[int]:
        finished = False
        try:
            while True:
                item = await box.queue.get()
                if item == FINISHED:
                    finished = True
                    return
                if isinstance(item, BaseException):
                    raise RuntimeError(f"engine died: {item!r}")
                n = item
                # Coalesce tokens that piled up while the client was slow, as vLLM's frontend does.
                while not box.queue.empty():
                    nxt = box.queue._queue[0]  # noqa: SLF001 - peek
                    if not isinstance(nxt, int):
                        break
                    n += box.queue.get_nowait()
                yield n
        finally:
            if not finished:
                self.rt.abort(rid)

    async def _through_ingress(self) -> None:
        """Wait for this chunk's turn on the (simulated) slow serving path, and its transfer."""
        if self.chunk_delay_s <= 0:
            return
        with self._ingress_lock:
            now = time.monotonic()
            done = max(now, self._ingress_free_at) + self.chunk_delay_s
            self._ingress_free_at = done
        await asyncio.sleep(done - now)

    async def sse(self, rid: str, box: Mailbox, chat: bool, include_usage: bool) -> AsyncIterator[bytes]:
        created, name = int(time.time()), self.name
        obj = "chat.completion.chunk" if chat else "text_completion"
        prefix = f'{{"id":"{rid}","object":"{obj}","created":{created},"model":{json.dumps(name)},"choices":['
        if chat:
            await self._through_ingress()
            yield ("data: " + prefix + '{"index":0,"delta":{"role":"assistant","content":""},'
                   '"finish_reason":null}]}\n\n').encode()
        try:
            async for n in self.tokens(rid, box):
                await self._through_ingress()
                text = " tok" * n
                if chat:
                    body = f'{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":null}}]}}'
                else:
                    body = f'{{"index":0,"text":"{text}","logprobs":null,"finish_reason":null}}]}}'
                yield ("data: " + prefix + body + "\n\n").encode()
        except RuntimeError as e:
            err = {"error": {"message": str(e), "type": "InternalServerError", "code": 500}}
            yield f"data: {json.dumps(err)}\n\n".encode()
            return
        last = ('{"index":0,"delta":{},"finish_reason":"length"}]}' if chat
                else '{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]}')
        yield ("data: " + prefix + last + "\n\n").encode()
        if include_usage:
            usage = {"prompt_tokens": box.prompt_tokens, "completion_tokens": box.generated,
                     "total_tokens": box.prompt_tokens + box.generated,
                     "prompt_tokens_details": {"cached_tokens": box.cached_tokens}}
            yield ("data: " + prefix + "]," + f'"usage":{json.dumps(usage)}}}' + "\n\n").encode()
        yield b"data: [DONE]\n\n"

    async def full(self, rid: str, box: Mailbox, chat: bool) -> dict:
        async for _ in self.tokens(rid, box):
            pass
        await self._through_ingress()
        text = " tok" * box.generated
        usage = {"prompt_tokens": box.prompt_tokens, "completion_tokens": box.generated,
                 "total_tokens": box.prompt_tokens + box.generated}
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                  if chat else {"index": 0, "text": text, "finish_reason": "length"})
        return {"id": rid, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": self.name, "choices": [choice], "usage": usage}

    def metrics_text(self) -> str:
        return metrics_text(self.rt, self.name)

    def facts(self) -> dict[str, Any]:
        m = self.rt.core.memory
        return {"kv_cache_tokens": m.kv_tokens, "kv_cache_gib": m.kv_bytes / 2**30,
                "num_gpu_blocks": m.num_blocks, "block_size": m.block_size,
                "weights_gib": m.weight_bytes_per_gpu / 2**30}


def error_body(status: int, message: str, kind: Optional[str] = None, param: Optional[str] = None) -> dict:
    """vLLM's ``ErrorResponse``: ``{"error": {message, type, param, code}}``."""
    kind = kind or ("BadRequestError" if status < 500 else "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


@web.middleware
async def _not_found_json(request, handler):
    """An unknown route or method answers FastAPI's JSON (what vLLM's server answers: 404
    ``{"detail": "Not Found"}``, 405 ``{"detail": "Method Not Allowed"}`` with ``Allow``)."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed as e:
        allow = ", ".join(sorted(m for m in e.allowed_methods if m != "HEAD"))
        return web.json_response({"detail": "Method Not Allowed"}, status=405, headers={"Allow": allow})
    except web.HTTPNotFound:
        return web.json_response({"detail": "Not Found"}, status=404)


async def start_direct_server(front: OpenAIFrontend, host: str = "127.0.0.1") -> int:
    """aiohttp server on the engine loop; returns its port."""

    async def completions(request: web.Request, chat: bool):
        try:
            body = await request.json()
        except Exception:  # noqa: BLE001
            return web.json_response(error_body(400, NOT_JSON), status=400)
        status, answer = await front.respond(body, chat)
        if isinstance(answer, dict):
            return web.json_response(answer, status=status)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        async for chunk in answer:
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    async def health(_):
        error = front.health_error()
        return web.Response(status=200) if error is None else web.json_response(error, status=500)

    async def models(_):
        return web.json_response(front.models_body())

    async def metrics(_):
        return web.Response(text=front.metrics_text(), content_type="text/plain")

    async def engine_facts(_):
        return web.json_response(front.facts())

    app = web.Application(client_max_size=64 * 2**20, middlewares=[_not_found_json])
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", lambda r: completions(r, False))
    app.router.add_post("/v1/chat/completions", lambda r: completions(r, True))
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/engine_facts", engine_facts)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    return site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - the bound ephemeral port


def build_sim_frontend(*, model_config: dict, model_name: str, gpu: str, engine_args: dict, calibration: dict,
                       served_model_name: str, dtype: str = "auto") -> OpenAIFrontend:
    """Build core + runtime (raises EngineStartError exactly as vLLM would fail to start)."""
    from orchestrator.study import SimCalibration

    model = ModelShape.from_config(model_config, name=model_name)
    args = EngineArgs(**{k: v for k, v in engine_args.items() if k != "extra"})
    core = SimEngineCore(model, get_gpu(gpu), args, SimCalibration(**calibration), dtype=dtype)
    return OpenAIFrontend(SimRuntime(core, args.stream_interval), model, args, served_model_name)


def build_ingress_class():
    """The Serve deployment class: FastAPI routes over the shared frontend, plus the direct server."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
    from ray import serve

    api = FastAPI()

    @serve.ingress(api)
    class SimLLMServer:
        def __init__(self, *, startup_s: float = 0.0, direct: bool = True, faults: tuple = (), **kwargs):
            from orchestrator.engines.sim_faults import Fault, LoadFaults, act_on_start, ingress_delay_s

            t0 = time.monotonic()
            injected = [Fault(**f) for f in faults]
            act_on_start(injected)
            self.front = build_sim_frontend(**kwargs)
            self.front.chunk_delay_s = ingress_delay_s(injected)
            self.direct_url = None
            if direct:
                import ray

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
            import ray

            return JSONResponse({**self.front.facts(), "direct_url": self.direct_url,
                                 "node_ip": getattr(self, "node_ip", None),
                                 "node_id": ray.get_runtime_context().get_node_id()})

        def check_health(self):
            if self.front.rt.error is not None:
                raise RuntimeError(f"engine loop died: {self.front.rt.error!r}")

    return SimLLMServer
