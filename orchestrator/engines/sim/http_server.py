"""The simulated engine's HTTP front end: an OpenAI-compatible streaming server in a Ray Serve replica.

The engine (:mod:`orchestrator.engines.sim.loop`: the simulator core stepping in real
time) runs on its own thread and event loop, like vLLM's engine core beside its API
server. :class:`OpenAIFrontend` parses requests and writes responses once; two HTTP
front doors serve it:

* the Serve ingress (FastAPI routes behind Ray Serve's proxy,
  :mod:`orchestrator.engines.sim.ingress`), and
* a direct aiohttp server in the replica (``transport: direct``). Serve's proxy
  moves each streamed chunk as a Ray object, a few hundred chunks per second on
  a small machine, far below what a simulated H100 emits; measuring through it
  would measure the proxy. The direct door is how vLLM's own API server is
  reached, and costs tens of microseconds per chunk.

Routes: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions`` (SSE or
JSON), ``/health``, ``/metrics`` (Prometheus text with vLLM's metric names: its
gauges, counters and request-latency histograms, see
:mod:`orchestrator.engines.sim.metrics`) and ``/engine_facts``.
"""

import asyncio
import json
import threading
import time
from typing import Any, AsyncIterator, Optional

from aiohttp import web

from orchestrator.engines.sim.logprobs import (GENERATED_TEXT, LogprobSource, chat_logprobs, completion_logprobs,
                                               prompt_logprobs_field, prompt_tokens)
from orchestrator.engines.sim.loop import FINISHED, Mailbox, SimRuntime
from orchestrator.engines.sim.metrics import metrics_text
from orchestrator.engines.sim.requests import ApiRequest, BadRequest, EngineRefusal, Prompt, error_body, parse_request
from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.gpus import get_gpu
from orchestrator.models.shapes import ModelShape
from orchestrator.sim.core import SimEngineCore
from orchestrator.study.spec import SimCalibration
from orchestrator.workload.generate import text_token_ids

__all__ = ["BadRequest", "OpenAIFrontend", "build_sim_frontend", "error_body",
           "serve_direct", "start_direct_server", "words_to_ids"]

NOT_JSON = "request body is not JSON"


def words_to_ids(text: str, vocab_size: int) -> list[int]:
    """Text prompts: word ``t123`` is token 123 (the workload's encoding); other words hash."""
    return list(text_token_ids(text, vocab_size))


class _Sub:
    """One engine request of an API request (a batched completions prompt has one per prompt)."""

    __slots__ = ("index", "prompt", "rid", "box", "sent", "echoed", "text_len", "logprobs")

    def __init__(self, index: int, prompt: Prompt, rid: str, box: Mailbox, logprobs: Optional[LogprobSource]):
        self.index, self.prompt, self.rid, self.box, self.logprobs = index, prompt, rid, box, logprobs
        self.sent = 0  # generated tokens already answered
        self.echoed = False
        self.text_len = 0  # characters already streamed (completions' text_offset)


class OpenAIFrontend:
    """Request parsing and response bodies, written once for both HTTP front doors."""

    def __init__(self, runtime: SimRuntime, model: ModelShape, args: EngineArgs, served_model_name: str):
        self.rt = runtime
        self.model = model
        self.args = args
        self.name = served_model_name
        self.created = int(time.time())
        # Fault ``ingress_delay``: a serving path that moves one streamed chunk at a time, each
        # taking this long (0: none). See orchestrator.engines.sim.faults.
        self.chunk_delay_s = 0.0
        self._ingress_lock = threading.Lock()
        self._ingress_free_at = 0.0

    def models_body(self) -> dict:
        return {"object": "list", "data": [{"id": self.name, "object": "model", "created": self.created,
                                            "owned_by": "orchestrator-sim", "max_model_len": self.args.max_model_len}]}

    async def start(self, body: Any, chat: bool) -> tuple[ApiRequest, list[_Sub]]:
        """Validate and submit; raises BadRequest (vLLM's status and error body)."""
        req = parse_request(body, chat, served_name=self.name, vocab_size=self.model.vocab_size)
        wants_logprobs = req.logprobs is not None or req.prompt_logprobs is not None
        subs, accepted = [], []
        for i, prompt in enumerate(req.prompts):
            rid, box, fut = self.rt.submit(list(prompt.ids), req.max_tokens)
            source = LogprobSource(prompt.ids, req.seed, self.model.vocab_size) if wants_logprobs else None
            subs.append(_Sub(i, prompt, rid, box, source))
            accepted.append(fut)
        outcomes = await asyncio.gather(*accepted, return_exceptions=True)
        refused = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if refused is not None:
            for sub, outcome in zip(subs, outcomes):
                if not isinstance(outcome, BaseException):
                    self.rt.abort(sub.rid)
            if isinstance(refused, ValueError):  # the core refused it (e.g. longer than max_model_len): vLLM's 400
                raise BadRequest(str(refused)) from None
            raise refused
        return req, subs

    async def respond(self, body: Any, chat: bool) -> tuple[int, Any]:
        """A completion request's answer, the same through either door: ``(status, JSON body)``,
        or ``(200, SSE chunks)`` (an async iterator of bytes) for a streamed one."""
        try:
            req, subs = await self.start(body, chat)
        except EngineRefusal as e:
            if e.stream:  # vLLM has answered 200 before its engine refuses the request
                return 200, _error_stream(e.body())
            return e.status, e.body()
        except BadRequest as e:
            return e.status, e.body()
        except RuntimeError as e:  # the engine is dead
            return 500, error_body(500, str(e))
        if req.stream:
            return 200, self.sse(req, subs)
        try:
            return 200, await self.full(req, subs)
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

    async def _merged(self, subs: list[_Sub]) -> AsyncIterator[tuple[_Sub, Optional[int]]]:
        """``(sub, new tokens)`` as each engine request makes them, ``(sub, None)`` when one ends."""
        if len(subs) == 1:  # the load generator's case: no tasks, no extra queue
            async for n in self.tokens(subs[0].rid, subs[0].box):
                yield subs[0], n
            yield subs[0], None
            return
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(sub: _Sub) -> None:
            try:
                async for n in self.tokens(sub.rid, sub.box):
                    merged.put_nowait((sub, n))
                merged.put_nowait((sub, None))
            except Exception as e:  # noqa: BLE001 - handed to the reader
                merged.put_nowait((sub, e))

        tasks = [asyncio.ensure_future(pump(sub)) for sub in subs]
        try:
            for _ in range(len(subs)):
                while True:
                    sub, item = await merged.get()
                    if isinstance(item, Exception):
                        raise item
                    yield sub, item
                    if item is None:
                        break
        finally:
            for task in tasks:  # a client that went away: each task's generator aborts its request
                task.cancel()

    async def _through_ingress(self) -> None:
        """Wait for this chunk's turn on the (simulated) slow serving path, and its transfer."""
        if self.chunk_delay_s <= 0:
            return
        with self._ingress_lock:
            now = time.monotonic()
            done = max(now, self._ingress_free_at) + self.chunk_delay_s
            self._ingress_free_at = done
        await asyncio.sleep(done - now)

    # ---- one piece of a choice: text and logprobs of the next tokens (echo puts the prompt first)

    def _piece(self, req: ApiRequest, sub: _Sub, n: int) -> tuple[str, list, list]:
        """The text of ``sub``'s next ``n`` generated tokens (the prompt first, once, under ``echo``),
        with their logprob steps and token texts (empty when logprobs are not asked for)."""
        steps: list = []
        texts: list[str] = []
        text = ""
        if req.echo and not sub.echoed:
            sub.echoed = True
            text = sub.prompt.text
            if req.logprobs is not None:
                texts = prompt_tokens(sub.prompt.text)
                top = req.logprobs if req.prompt_logprobs is None else req.prompt_logprobs
                steps = sub.logprobs.prompt(sub.prompt.ids, texts, top)
        if req.echo_only:  # the one token vLLM generates is not returned
            sub.sent += n
            return text, steps, texts
        text += GENERATED_TEXT * n
        if req.logprobs is not None:
            steps += [sub.logprobs.generated(sub.sent + k, req.logprobs) for k in range(n)]
            texts += [GENERATED_TEXT] * n
        sub.sent += n
        return text, steps, texts

    @staticmethod
    def _logprobs(req: ApiRequest, steps: list, texts: list, text_len: int) -> Optional[dict]:
        if req.logprobs is None:
            return None
        if req.chat:
            return chat_logprobs(steps, texts, req.logprobs)
        return completion_logprobs(steps, texts, req.logprobs, offset=text_len)

    async def sse(self, req: ApiRequest, subs: list[_Sub]) -> AsyncIterator[bytes]:
        chat = req.chat
        created, name = int(time.time()), self.name
        obj = "chat.completion.chunk" if chat else "text_completion"
        prefix = f'{{"id":"{subs[0].rid}","object":"{obj}","created":{created},"model":{json.dumps(name)},"choices":['
        plain = req.logprobs is None and not req.echo  # the hot path: chunks written without json.dumps
        if chat:
            await self._through_ingress()
            yield ("data: " + prefix + '{"index":0,"delta":{"role":"assistant","content":""},'
                   '"finish_reason":null}]}\n\n').encode()
        try:
            async for sub, n in self._merged(subs):
                await self._through_ingress()
                if n is None:
                    last = ('{"index":0,"delta":{},"finish_reason":"length"}]}' if chat
                            else f'{{"index":{sub.index},"text":"","logprobs":null,"finish_reason":"length"}}]}}')
                    yield ("data: " + prefix + last + "\n\n").encode()
                    continue
                if plain:
                    text = GENERATED_TEXT * n
                    if chat:
                        body = f'{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":null}}]}}'
                    else:
                        body = f'{{"index":{sub.index},"text":"{text}","logprobs":null,"finish_reason":null}}]}}'
                else:
                    text, steps, texts = self._piece(req, sub, n)
                    logprobs = self._logprobs(req, steps, texts, sub.text_len)
                    sub.text_len += len(text)
                    choice = ({"index": 0, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": None}
                              if chat else
                              {"index": sub.index, "text": text, "logprobs": logprobs, "finish_reason": None})
                    body = json.dumps(choice) + "]}"
                yield ("data: " + prefix + body + "\n\n").encode()
        except RuntimeError as e:
            err = {"error": {"message": str(e), "type": "InternalServerError", "code": 500}}
            yield f"data: {json.dumps(err)}\n\n".encode()
            return
        if req.include_usage:
            yield ("data: " + prefix + "]," + f'"usage":{json.dumps(self._usage(subs, cached=True))}}}' + "\n\n").encode()
        yield b"data: [DONE]\n\n"

    @staticmethod
    def _usage(subs: list[_Sub], cached: bool = False) -> dict:
        prompt = sum(s.box.prompt_tokens for s in subs)
        generated = sum(s.box.generated for s in subs)
        usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": generated,
                                 "total_tokens": prompt + generated}
        if cached:
            usage["prompt_tokens_details"] = {"cached_tokens": sum(s.box.cached_tokens for s in subs)}
        return usage

    async def full(self, req: ApiRequest, subs: list[_Sub]) -> dict:
        async for _ in self._merged(subs):
            pass
        await self._through_ingress()
        choices = []
        prompt_logprobs = None
        for sub in subs:
            text, steps, texts = self._piece(req, sub, sub.box.generated)
            logprobs = self._logprobs(req, steps, texts, 0)
            if req.prompt_logprobs is not None:  # vLLM's extension: every prompt token's candidates
                ptexts = prompt_tokens(sub.prompt.text)
                prompt_logprobs = prompt_logprobs_field(sub.logprobs.prompt(sub.prompt.ids, ptexts,
                                                                            req.prompt_logprobs))
            if req.chat:
                choices.append({"index": 0, "message": {"role": "assistant", "content": text},
                                "logprobs": logprobs, "finish_reason": "length"})
            else:
                choices.append({"index": sub.index, "text": text, "logprobs": logprobs, "finish_reason": "length",
                                "prompt_logprobs": prompt_logprobs})
        answer = {"id": subs[0].rid, "object": "chat.completion" if req.chat else "text_completion",
                  "created": int(time.time()), "model": self.name, "choices": choices, "usage": self._usage(subs)}
        if req.chat and req.prompt_logprobs is not None:
            answer["prompt_logprobs"] = prompt_logprobs
        return answer

    def metrics_text(self) -> str:
        return metrics_text(self.rt, self.name)

    def facts(self) -> dict[str, Any]:
        m = self.rt.core.memory
        return {"kv_cache_tokens": m.kv_tokens, "kv_cache_gib": m.kv_bytes / 2**30,
                "num_gpu_blocks": m.num_blocks, "block_size": m.block_size,
                "weights_gib": m.weight_bytes_per_gpu / 2**30}


async def _error_stream(body: dict) -> AsyncIterator[bytes]:
    yield f"data: {json.dumps(body)}\n\n".encode()
    yield b"data: [DONE]\n\n"


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
    _, port = await serve_direct(front, host, 0)
    return port


async def serve_direct(front: OpenAIFrontend, host: str, port: int) -> tuple[web.AppRunner, int]:
    """The direct door on ``host:port`` (0: any free port), on the running loop: its runner
    (``cleanup()`` stops it) and the bound port. Raises OSError when the port is taken."""

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
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    return runner, site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - the bound (ephemeral) port


def build_sim_frontend(*, model_config: dict, model_name: str, gpu: str, engine_args: dict, calibration: dict,
                       served_model_name: str, dtype: str = "auto") -> OpenAIFrontend:
    """Build core + runtime (raises EngineStartError exactly as vLLM would fail to start)."""

    model = ModelShape.from_config(model_config, name=model_name)
    args = EngineArgs(**{k: v for k, v in engine_args.items() if k != "extra"})
    core = SimEngineCore(model, get_gpu(gpu), args, SimCalibration(**calibration), dtype=dtype)
    return OpenAIFrontend(SimRuntime(core, args.stream_interval), model, args, served_model_name)
