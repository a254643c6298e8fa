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
JSON), ``/health``, ``/version`` (the vLLM version it answers as), ``/metrics``
(Prometheus text with vLLM's metric names: its gauges, counters and request-latency
histograms, see :mod:`orchestrator.engines.sim.metrics`) and ``/engine_facts``.
"""

import asyncio
import contextlib
import json
import threading
import time
from typing import Any, AsyncIterator, Optional

from aiohttp import web

from orchestrator.engines.sim.chunks import (Sub, chat_chunk, choice_logprobs, chunk_usage, completion_chunk,
                                             echo_chunk, finish, no_usage, piece, role_chunk, usage)
from orchestrator.engines.sim.logprobs import GENERATED_TEXT, LogprobSource, prompt_logprobs_field, prompt_tokens
from orchestrator.engines.sim.loop import FINISHED, Mailbox, SimRuntime
from orchestrator.engines.sim.metrics import metrics_text
from orchestrator.engines.sim.requests import (VLLM_VERSION, ApiRequest, BadRequest, EngineRefusal, error_body,
                                               parse_request)
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

    @staticmethod
    def version_body() -> dict:
        return {"version": VLLM_VERSION}

    async def start(self, body: Any, chat: bool) -> tuple[ApiRequest, list[Sub]]:
        """Validate and submit; raises BadRequest (vLLM's status and error body)."""
        req = parse_request(body, chat, served_name=self.name, vocab_size=self.model.vocab_size)
        wants_logprobs = req.logprobs is not None or req.prompt_logprobs is not None
        end = req.ending
        subs, accepted = [], []
        for p, prompt in enumerate(req.prompts):
            for j in range(req.n):
                rid, box, fut = self.rt.submit(list(prompt.ids), req.max_tokens, stop_after=end.tokens,
                                               finish_reason=end.finish_reason, priority=req.priority)
                source = LogprobSource(prompt.ids, req.seed, self.model.vocab_size, j) if wants_logprobs else None
                subs.append(Sub(p * req.n + j, j == 0, prompt, rid, box, source))
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

    async def tokens(self, rid: str, box: Mailbox) -> AsyncIterator[tuple[int, bool]]:
        """``(new tokens, finished)``: a request's last tokens come with its end, as in vLLM's last output."""
        finished = False
        try:
            while True:
                item = await box.queue.get()
                if item == FINISHED:
                    finished = True
                    yield 0, True
                    return
                if isinstance(item, BaseException):
                    raise RuntimeError(f"engine died: {item!r}")
                n = item
                # Coalesce tokens that piled up while the client was slow, as vLLM's frontend does.
                while not box.queue.empty():
                    nxt = box.queue._queue[0]  # noqa: SLF001 - peek
                    if nxt == FINISHED:
                        box.queue.get_nowait()
                        finished = True
                        break
                    if not isinstance(nxt, int):
                        break
                    n += box.queue.get_nowait()
                yield n, finished
                if finished:
                    return
        finally:
            if not finished:
                self.rt.abort(rid)

    async def _merged(self, subs: list[Sub]) -> AsyncIterator[tuple[Sub, int, bool]]:
        """``(sub, new tokens, finished)`` as each engine request makes them."""
        if len(subs) == 1:  # the load generator's case: no tasks, no extra queue
            async for n, done in self.tokens(subs[0].rid, subs[0].box):
                yield subs[0], n, done
            return
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(sub: Sub) -> None:
            try:
                async for n, done in self.tokens(sub.rid, sub.box):
                    merged.put_nowait((sub, n, done))
            except Exception as e:  # noqa: BLE001 - handed to the reader
                merged.put_nowait((sub, e, True))

        tasks = [asyncio.ensure_future(pump(sub)) for sub in subs]
        try:
            left = len(subs)
            while left:
                sub, n, done = await merged.get()
                if isinstance(n, Exception):
                    raise n
                yield sub, n, done
                left -= done
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

    async def sse(self, req: ApiRequest, subs: list[Sub]) -> AsyncIterator[bytes]:
        """vLLM's chunks: chat's role chunk per choice first, one chunk per step's tokens (the last
        with ``finish_reason``), usage per chunk with ``continuous_usage_stats``, a usage chunk
        with ``include_usage``."""
        chat = req.chat
        created, name = int(time.time()), self.name
        obj = "chat.completion.chunk" if chat else "text_completion"
        prefix = (f'data: {{"id":"{subs[0].rid}","object":"{obj}","created":{created},"model":{json.dumps(name)},'
                  '"choices":[')
        # the hot path (the load generator's requests): chunks written without json.dumps
        plain = req.logprobs is None and not req.echo and not req.stop.active and not req.continuous_usage
        close = chunk_usage if req.continuous_usage else no_usage
        if chat:
            await self._through_ingress()
            for sub in subs:  # vLLM: the role first, for each choice, then the last message under echo
                yield (prefix + role_chunk(sub.index) + close(sub.box.prompt_tokens, 0, chat) + "\n\n").encode()
            for sub in subs if req.chat_echo else ():
                yield (prefix + echo_chunk(sub.index, req.chat_echo) + close(sub.box.prompt_tokens, 0, chat)
                       + "\n\n").encode()
        try:
            async for sub, n, done in self._merged(subs):
                await self._through_ingress()
                if plain:
                    text = GENERATED_TEXT * n
                    sub.sent += n
                    if chat:
                        body = (f'{{"index":{sub.index},"delta":{{"content":"{text}"}},"logprobs":null,'
                                + ('"finish_reason":"length","stop_reason":null,"token_ids":null}]}'
                                   if done else '"finish_reason":null,"token_ids":null}]}'))
                    else:
                        body = (f'{{"index":{sub.index},"text":"{text}","logprobs":null,"finish_reason":'
                                + ('"length"' if done else 'null')
                                + ',"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}')
                    yield (prefix + body + "\n\n").encode()
                    continue
                text, steps, texts = piece(req, sub, n, done)
                logprobs = choice_logprobs(req, steps, texts, sub.text_len)
                sub.text_len += len(text)
                end = finish(req, sub) if done else None
                choice = (chat_chunk if chat else completion_chunk)(sub.index, text, logprobs, end)
                yield (prefix + choice + close(sub.box.prompt_tokens, sub.sent, chat) + "\n\n").encode()
        except RuntimeError as e:
            err = {"error": {"message": str(e), "type": "InternalServerError", "code": 500}}
            yield f"data: {json.dumps(err)}\n\n".encode()
            return
        if req.include_usage:
            yield (prefix + "]," + f'"usage":{json.dumps(usage(subs, cached=True))}}}' + "\n\n").encode()
        yield b"data: [DONE]\n\n"

    async def full(self, req: ApiRequest, subs: list[Sub]) -> dict:
        async for _ in self._merged(subs):
            pass
        await self._through_ingress()
        choices = []
        prompt_logprobs = None
        for sub in subs:
            text, steps, texts = piece(req, sub, sub.box.generated, True)
            logprobs = choice_logprobs(req, steps, texts, 0)
            finish_reason, stop_reason = finish(req, sub)
            if req.prompt_logprobs is not None:  # vLLM's extension: every prompt token's candidates
                ptexts = prompt_tokens(sub.prompt.text)
                prompt_logprobs = prompt_logprobs_field(sub.logprobs.prompt(sub.prompt.ids, ptexts,
                                                                            req.prompt_logprobs))
            if req.chat:
                choices.append({"index": sub.index, "message": {"role": "assistant", "content": req.chat_echo + text},
                                "logprobs": logprobs, "finish_reason": finish_reason, "stop_reason": stop_reason})
            else:
                choices.append({"index": sub.index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
                                "stop_reason": stop_reason, "prompt_logprobs": prompt_logprobs})
        answer = {"id": subs[0].rid, "object": "chat.completion" if req.chat else "text_completion",
                  "created": int(time.time()), "model": self.name, "choices": choices, "usage": usage(subs)}
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
        try:
            async with contextlib.aclosing(answer) as chunks:  # closed now, not when collected: aborts the request
                async for chunk in chunks:
                    await resp.write(chunk)
            await resp.write_eof()
        except ConnectionResetError:  # the client went away (a window's end, its timeout): as vLLM, stop quietly
            pass
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

    async def version(_):
        return web.json_response(front.version_body())

    app = web.Application(client_max_size=64 * 2**20, middlewares=[_not_found_json])
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", lambda r: completions(r, False))
    app.router.add_post("/v1/chat/completions", lambda r: completions(r, True))
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/engine_facts", engine_facts)
    app.router.add_get("/version", version)
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
