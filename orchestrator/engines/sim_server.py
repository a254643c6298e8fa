"""The simulated engine as an OpenAI-compatible streaming server inside a Ray Serve replica.

The engine (simulator core + a loop that sleeps each step's simulated duration)
runs on its own thread and event loop, like vLLM's engine core beside its API
server. Two HTTP front doors share it:

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
import itertools
import json
import threading
import time
from typing import Any, AsyncIterator, Callable, Optional

from fastapi import Request  # a real annotation object below: Ray versions resolve string ones differently
from pydantic import TypeAdapter, ValidationError

from orchestrator.engine_args import EngineArgs
from orchestrator.engines.sim_metrics import SimRequestMetrics
from orchestrator.sim.core import SimEngineCore, SimRequest
from orchestrator.sim.hardware import get_gpu
from orchestrator.sim.models import ModelShape
from orchestrator.workload.generate import text_token_ids

_FINISHED = "finished"


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


class _Mailbox:
    """Tokens for one request, delivered into the caller's event loop."""

    __slots__ = ("queue", "loop", "prompt_tokens", "cached_tokens", "generated", "pending")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.loop = loop
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generated = 0
        self.pending = 0  # generated but not yet streamed (stream_interval)


class SimRuntime:
    """Owns the simulator core; all core calls happen on the engine thread."""

    def __init__(self, core: SimEngineCore, stream_interval: int = 1):
        self.core = core
        self.stream_interval = max(1, stream_interval)
        self.loop = asyncio.new_event_loop()
        self.mailboxes: dict[str, _Mailbox] = {}
        self.ids = itertools.count()
        self.error: Optional[BaseException] = None
        self.request_success = 0
        self.metrics = SimRequestMetrics()  # vLLM's request-latency histograms (engine thread)
        self.on_accept: Optional[Callable[[], None]] = None  # per accepted request (fault injection)
        self._pending_failure: Optional[BaseException] = None
        self._wake: Optional[asyncio.Event] = None
        ready = threading.Event()
        self.thread = threading.Thread(target=self._thread_main, args=(ready,), name="sim-engine", daemon=True)
        self.thread.start()
        ready.wait()

    def _thread_main(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self._wake = asyncio.Event()
        self.loop.create_task(self._engine_loop())
        ready.set()
        self.loop.run_forever()

    def _deliver(self, box: _Mailbox, item) -> None:
        if box.loop is self.loop:
            box.queue.put_nowait(item)
        else:
            box.loop.call_soon_threadsafe(box.queue.put_nowait, item)

    async def _engine_loop(self) -> None:
        loop = self.loop
        next_free = loop.time()
        try:
            while True:
                if self._pending_failure is not None:
                    raise self._pending_failure
                if not self.core.has_work():
                    self._wake.clear()
                    await self._wake.wait()
                    next_free = loop.time()
                    continue
                start = max(loop.time(), next_free)
                result = self.core.step()
                # Step boundaries stay on a wall-clock timeline: a late wake-up shortens
                # the next sleep instead of shifting every later token.
                next_free = start + result.duration_s
                delay = next_free - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                # Recorded before any token reaches a client: a scrape after the client saw a
                # request end always counts it.
                self.metrics.step(result.outputs, start, loop.time())
                for out in result.outputs:
                    box = self.mailboxes.get(out.request_id)
                    if box is None:
                        continue
                    box.prompt_tokens = out.num_prompt_tokens
                    box.cached_tokens = out.num_cached_tokens
                    if out.new_tokens:
                        # vLLM's stream_interval: the first token at once, then every N tokens.
                        first = box.generated == 0
                        box.generated += out.new_tokens
                        box.pending += out.new_tokens
                        if first or out.finished or box.pending >= self.stream_interval:
                            self._deliver(box, box.pending)
                            box.pending = 0
                    if out.finished:
                        if box.pending:
                            self._deliver(box, box.pending)
                            box.pending = 0
                        self.mailboxes.pop(out.request_id, None)
                        self.request_success += 1
                        self._deliver(box, _FINISHED)
        except BaseException as e:  # noqa: BLE001 - every waiting request must learn of it
            self.error = e
            for box in list(self.mailboxes.values()):
                self._deliver(box, e)
            raise

    # ---- called from any thread / loop
    def submit(self, prompt_ids: list[int], max_tokens: int):
        """Queue a request on the engine thread; returns (request id, mailbox, accepted future)."""
        if self.error is not None:
            raise RuntimeError(f"engine dead: {self.error!r}")
        arrival = time.monotonic()  # vLLM's arrival_time: the front end has the request
        rid = f"cmpl-{next(self.ids)}"
        box = _Mailbox(asyncio.get_running_loop())
        box.prompt_tokens = len(prompt_ids)
        fut: "asyncio.Future" = asyncio.get_running_loop().create_future()
        caller = asyncio.get_running_loop()

        def _add():
            queued = time.monotonic()
            try:
                self.core.add_request(SimRequest(rid, prompt_ids, max_tokens, arrival_s=queued))
            except ValueError as e:  # too long for max_model_len: vLLM answers 400
                caller.call_soon_threadsafe(fut.set_exception, BadRequest(str(e)))
                return
            self.metrics.add(rid, arrival, queued)
            self.mailboxes[rid] = box
            self._wake.set()
            caller.call_soon_threadsafe(fut.set_result, None)
            if self.on_accept is not None:
                self.on_accept()

        self.loop.call_soon_threadsafe(_add)
        return rid, box, fut

    def inject_failure(self, error: BaseException) -> None:
        """Make the engine loop die of ``error`` at its next step, as a failing engine core would."""

        def _fail():
            self._pending_failure = error
            self._wake.set()

        self.loop.call_soon_threadsafe(_fail)

    def abort(self, rid: str) -> None:
        def _abort():
            self.metrics.abort(rid)
            if self.mailboxes.pop(rid, None) is not None:
                try:
                    self.core.abort_request(rid)
                except Exception:  # noqa: BLE001 - it finished meanwhile
                    pass

        self.loop.call_soon_threadsafe(_abort)


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
        await accepted
        return rid, box

    async def tokens(self, rid: str, box: _Mailbox) -> AsyncIterator[int]:
        finished = False
        try:
            while True:
                item = await box.queue.get()
                if item == _FINISHED:
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

    async def sse(self, rid: str, box: _Mailbox, chat: bool, include_usage: bool) -> AsyncIterator[bytes]:
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

    async def full(self, rid: str, box: _Mailbox, chat: bool) -> dict:
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
        s = self.rt.core.stats()
        m = self.rt.core.memory
        labels = f'{{model_name="{self.name}",engine="0"}}'
        rows = [
            ("vllm:num_requests_running", "gauge", s.num_requests_running),
            ("vllm:num_requests_waiting", "gauge", s.num_requests_waiting),
            ("vllm:kv_cache_usage_perc", "gauge", s.kv_cache_usage),
            ("vllm:num_preemptions_total", "counter", s.num_preemptions_total),
            ("vllm:prefix_cache_queries_total", "counter", s.prefix_cache_queries_total),
            ("vllm:prefix_cache_hits_total", "counter", s.prefix_cache_hits_total),
            ("vllm:prompt_tokens_total", "counter", s.prompt_tokens_total),
            ("vllm:generation_tokens_total", "counter", s.generation_tokens_total),
        ]
        out = []
        for name, kind, value in rows:
            out.append(f"# TYPE {name.removesuffix('_total')} {kind}")
            out.append(f"{name}{labels} {float(value)}")
        # The simulated requests all end at max_tokens (ignore_eos): finished_reason "length".
        out.append("# TYPE vllm:request_success counter")
        out.append(f'vllm:request_success_total{{model_name="{self.name}",engine="0",finished_reason="length"}} '
                   f"{float(self.rt.request_success)}")
        out += self.rt.metrics.exposition(f'model_name="{self.name}",engine="0"')
        out.append("# TYPE vllm:cache_config_info gauge")
        out.append(f'vllm:cache_config_info{{block_size="{m.block_size}",num_gpu_blocks="{m.num_blocks}",'
                   f'engine="0"}} 1.0')
        return "\n".join(out) + "\n"

    def facts(self) -> dict[str, Any]:
        m = self.rt.core.memory
        return {"kv_cache_tokens": m.kv_tokens, "kv_cache_gib": m.kv_bytes / 2**30,
                "num_gpu_blocks": m.num_blocks, "block_size": m.block_size,
                "weights_gib": m.weight_bytes_per_gpu / 2**30}


def error_body(status: int, message: str, kind: Optional[str] = None, param: Optional[str] = None) -> dict:
    """vLLM's ``ErrorResponse``: ``{"error": {message, type, param, code}}``."""
    kind = kind or ("BadRequestError" if status < 500 else "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def _not_found_json():
    """aiohttp middleware: an unknown route or method answers FastAPI's JSON (what vLLM's server
    answers: 404 ``{"detail": "Not Found"}``, 405 ``{"detail": "Method Not Allowed"}`` with ``Allow``)."""
    from aiohttp import web

    @web.middleware
    async def middleware(request, handler):
        try:
            return await handler(request)
        except web.HTTPMethodNotAllowed as e:
            allow = ", ".join(sorted(m for m in e.allowed_methods if m != "HEAD"))
            return web.json_response({"detail": "Method Not Allowed"}, status=405, headers={"Allow": allow})
        except web.HTTPNotFound:
            return web.json_response({"detail": "Not Found"}, status=404)

    return middleware


async def start_direct_server(front: OpenAIFrontend, host: str = "127.0.0.1") -> int:
    """aiohttp server on the engine loop; returns its port."""
    from aiohttp import web

    async def completions(request: web.Request, chat: bool):
        try:
            body = await request.json()
        except Exception:  # noqa: BLE001
            return web.json_response(error_body(400, "request body is not JSON"), status=400)
        try:
            rid, box = await front.start(body, chat)
        except BadRequest as e:
            return web.json_response(e.body(), status=e.status)
        except RuntimeError as e:
            return web.json_response(error_body(500, str(e)), status=500)
        if not body.get("stream"):
            try:
                return web.json_response(await front.full(rid, box, chat))
            except RuntimeError as e:
                return web.json_response(error_body(500, str(e)), status=500)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        async for chunk in front.sse(rid, box, chat, include_usage):
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    async def health(_):
        if front.rt.error is not None:
            return web.json_response(error_body(500, f"engine dead: {front.rt.error!r}"), status=500)
        return web.Response(status=200)

    app = web.Application(client_max_size=64 * 2**20, middlewares=[_not_found_json()])
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", lambda _: _json(front.models_body()))
    app.router.add_post("/v1/completions", lambda r: completions(r, False))
    app.router.add_post("/v1/chat/completions", lambda r: completions(r, True))
    app.router.add_get("/metrics", lambda _: _text(front.metrics_text()))
    app.router.add_get("/engine_facts", lambda _: _json(front.facts()))
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    return site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - the bound ephemeral port


async def _json(body: dict):
    from aiohttp import web

    return web.json_response(body)


async def _text(text: str):
    from aiohttp import web

    return web.Response(text=text, content_type="text/plain")


def build_sim_frontend(*, model_config: dict, model_name: str, gpu: str, engine_args: dict, calibration: dict,
                       served_model_name: str, dtype: str = "auto") -> OpenAIFrontend:
    """Build core + runtime (raises EngineStartError exactly as vLLM would fail to start)."""
    from orchestrator.study import SimCalibration

    model = ModelShape.from_config(model_config, name=model_name)
    args = EngineArgs(**{k: v for k, v in engine_args.items() if k != "extra"})
    core = SimEngineCore(model, get_gpu(gpu), args, SimCalibration(**calibration), dtype=dtype)
    return OpenAIFrontend(SimRuntime(core, args.stream_interval), model, args, served_model_name)


def _ray_node_id() -> Optional[str]:
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - outside Ray
        return None


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
            if self.front.rt.error is not None:
                return JSONResponse(error_body(500, f"engine dead: {self.front.rt.error!r}"), status_code=500)
            return Response(status_code=200)

        @api.get("/v1/models")
        async def models(self):
            return JSONResponse(self.front.models_body())

        async def _complete(self, request: Request, chat: bool):
            try:
                body = await request.json()
            except Exception:  # noqa: BLE001
                return JSONResponse(error_body(400, "request body is not JSON"), status_code=400)
            try:
                rid, box = await self.front.start(body, chat)
            except BadRequest as e:
                return JSONResponse(e.body(), status_code=e.status)
            except RuntimeError as e:
                return JSONResponse(error_body(500, str(e)), status_code=500)
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return StreamingResponse(self.front.sse(rid, box, chat, include_usage),
                                         media_type="text/event-stream")
            try:
                return JSONResponse(await self.front.full(rid, box, chat))
            except RuntimeError as e:
                return JSONResponse(error_body(500, str(e)), status_code=500)

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
            facts = self.front.facts()
            facts["direct_url"] = self.direct_url
            facts["node_ip"] = getattr(self, "node_ip", None)
            facts["node_id"] = _ray_node_id()
            return JSONResponse(facts)

        def check_health(self):
            if self.front.rt.error is not None:
                raise RuntimeError(f"engine loop died: {self.front.rt.error!r}")

    return SimLLMServer
