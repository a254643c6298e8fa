"""The simulated engine as an OpenAI-compatible streaming server (a Ray Serve deployment).

One asyncio task runs the engine loop: schedule a step with the simulator core,
sleep its simulated duration, hand each request its new tokens. Requests that
arrive during a step wait for the next one, as in vLLM. The server speaks
``/v1/models``, ``/v1/completions``, ``/v1/chat/completions`` (SSE streaming and
plain JSON), ``/health`` and ``/metrics`` (Prometheus text with vLLM's metric names).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import zlib
from typing import Any, AsyncIterator, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from orchestrator.engine_args import EngineArgs
from orchestrator.sim.core import SimEngineCore, SimRequest
from orchestrator.sim.hardware import get_gpu
from orchestrator.sim.models import ModelShape

_FINISHED = object()


def _words_to_ids(text: str, vocab_size: int) -> list[int]:
    """Text prompts: word ``t123`` is token 123 (the workload's encoding); other words hash."""
    ids = []
    for w in text.split():
        if w[:1] == "t" and w[1:].isdigit():
            ids.append(int(w[1:]) % vocab_size)
        else:
            ids.append(zlib.crc32(w.encode()) % vocab_size)
    return ids or [0]


class _Stream:
    """Per-request mailbox between the engine loop and the HTTP response."""

    __slots__ = ("queue", "prompt_tokens", "cached_tokens", "generated")

    def __init__(self):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generated = 0


class SimServer:
    """Deployment body; wrapped with ``serve.deployment`` + ``serve.ingress`` in sim_serve.py."""

    def __init__(self, *, model_config: dict, model_name: str, gpu: str, engine_args: dict,
                 calibration: dict, served_model_name: str, startup_s: float = 0.0, dtype: str = "auto"):
        from orchestrator.study import SimCalibration

        t0 = time.monotonic()
        self.model = ModelShape.from_config(model_config, name=model_name)
        args = EngineArgs(**{k: v for k, v in engine_args.items() if k != "extra"})
        # Raises EngineStartError (KV cache too small, weights OOM, ...) like vLLM at start.
        self.core = SimEngineCore(self.model, get_gpu(gpu), args, SimCalibration(**calibration), dtype=dtype)
        self.args = args
        self.served_model_name = served_model_name
        self.streams: dict[str, _Stream] = {}
        self.ids = itertools.count()
        self.wake: Optional[asyncio.Event] = None
        self.loop_task: Optional[asyncio.Task] = None
        self.loop_error: Optional[BaseException] = None
        self.request_success = 0
        self.created = int(time.time())
        if startup_s > 0:
            time.sleep(max(0.0, startup_s - (time.monotonic() - t0)))

    # ------------------------------------------------------------ engine loop
    def _ensure_loop(self) -> None:
        if self.loop_task is None or self.loop_task.done():
            self.wake = asyncio.Event()
            self.loop_task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_free = loop.time()
        try:
            while True:
                if not self.core.has_work():
                    self.wake.clear()
                    await self.wake.wait()
                    next_free = loop.time()
                    continue
                start = max(loop.time(), next_free)
                result = self.core.step()
                # Keep simulated step boundaries on a wall-clock timeline: a late wake-up
                # shortens the next sleep instead of drifting every later token.
                next_free = start + result.duration_s
                delay = next_free - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                for out in result.outputs:
                    stream = self.streams.get(out.request_id)
                    if stream is None:
                        continue
                    stream.prompt_tokens = out.num_prompt_tokens
                    stream.cached_tokens = out.num_cached_tokens
                    if out.new_tokens:
                        stream.generated += out.new_tokens
                        stream.queue.put_nowait(out.new_tokens)
                    if out.finished:
                        stream.queue.put_nowait(_FINISHED)
        except BaseException as e:  # noqa: BLE001 - surface to every waiting request
            self.loop_error = e
            for s in self.streams.values():
                s.queue.put_nowait(e)
            raise

    def _submit(self, prompt_ids: list[int], max_tokens: int) -> tuple[str, _Stream]:
        self._ensure_loop()
        rid = f"cmpl-{next(self.ids)}"
        stream = _Stream()
        stream.prompt_tokens = len(prompt_ids)
        self.streams[rid] = stream
        self.core.add_request(SimRequest(rid, prompt_ids, max_tokens, arrival_s=time.monotonic()))
        self.wake.set()
        return rid, stream

    def _release(self, rid: str, finished: bool) -> None:
        self.streams.pop(rid, None)
        if finished:
            self.request_success += 1
        else:
            try:
                self.core.abort_request(rid)
            except Exception:  # noqa: BLE001 - already finished
                pass

    # ------------------------------------------------------------ request parsing
    def _prompt_ids(self, body: dict, chat: bool) -> list[int]:
        v = self.model.vocab_size
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise ValueError("'messages' must be a non-empty list")
            text = " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
            return _words_to_ids(text, v)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]  # batch of one
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) and prompt:
            return [t % v for t in prompt]
        if isinstance(prompt, str) and prompt:
            return _words_to_ids(prompt, v)
        raise ValueError("'prompt' must be a non-empty string or list of token ids")

    async def handle(self, request: Request, chat: bool) -> Response:
        try:
            body = await request.json()
        except Exception:  # noqa: BLE001
            return _error(400, "request body is not JSON")
        try:
            ids = self._prompt_ids(body, chat)
            max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
            if max_tokens < 1:
                raise ValueError("max_tokens must be at least 1")
            rid, stream = self._submit(ids, max_tokens)
        except ValueError as e:
            return _error(400, str(e))
        if self.loop_error is not None:
            return _error(500, f"engine dead: {self.loop_error!r}")
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(self._sse(rid, stream, chat, include_usage), media_type="text/event-stream")
        return await self._full(rid, stream, chat)

    async def _tokens(self, rid: str, stream: _Stream) -> AsyncIterator[int]:
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if item is _FINISHED:
                    finished = True
                    return
                if isinstance(item, BaseException):
                    raise RuntimeError(f"engine died: {item!r}")
                # Coalesce tokens that piled up while the client was slow, as vLLM's frontend does.
                n = item
                while not stream.queue.empty():
                    nxt = stream.queue._queue[0]  # noqa: SLF001 - peek
                    if not isinstance(nxt, int):
                        break
                    n += stream.queue.get_nowait()
                yield n
        finally:
            self._release(rid, finished)

    async def _sse(self, rid: str, stream: _Stream, chat: bool, include_usage: bool):
        created = int(time.time())
        model = self.served_model_name
        obj = "chat.completion.chunk" if chat else "text_completion"
        if chat:
            head = {"id": rid, "object": obj, "created": created, "model": model,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
            yield f"data: {json.dumps(head)}\n\n"
        async for n in self._tokens(rid, stream):
            text = " tok" * n
            if chat:
                choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
            yield "data: " + json.dumps({"id": rid, "object": obj, "created": created, "model": model,
                                         "choices": [choice]}) + "\n\n"
        done_choice = ({"index": 0, "delta": {}, "finish_reason": "length"} if chat
                       else {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"})
        yield "data: " + json.dumps({"id": rid, "object": obj, "created": created, "model": model,
                                     "choices": [done_choice]}) + "\n\n"
        if include_usage:
            usage = {"prompt_tokens": stream.prompt_tokens, "completion_tokens": stream.generated,
                     "total_tokens": stream.prompt_tokens + stream.generated,
                     "prompt_tokens_details": {"cached_tokens": stream.cached_tokens}}
            yield "data: " + json.dumps({"id": rid, "object": obj, "created": created, "model": model,
                                         "choices": [], "usage": usage}) + "\n\n"
        yield "data: [DONE]\n\n"

    async def _full(self, rid: str, stream: _Stream, chat: bool) -> Response:
        try:
            async for _ in self._tokens(rid, stream):
                pass
        except RuntimeError as e:
            return _error(500, str(e))
        text = " tok" * stream.generated
        usage = {"prompt_tokens": stream.prompt_tokens, "completion_tokens": stream.generated,
                 "total_tokens": stream.prompt_tokens + stream.generated}
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                  if chat else {"index": 0, "text": text, "finish_reason": "length"})
        return JSONResponse({"id": rid, "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": self.served_model_name,
                             "choices": [choice], "usage": usage})

    # ------------------------------------------------------------ metrics
    def metrics_text(self) -> str:
        s = self.core.stats()
        labels = f'{{model_name="{self.served_model_name}",engine="0"}}'
        rows = [
            ("vllm:num_requests_running", "gauge", s.num_requests_running),
            ("vllm:num_requests_waiting", "gauge", s.num_requests_waiting),
            ("vllm:kv_cache_usage_perc", "gauge", s.kv_cache_usage),
            ("vllm:num_preemptions_total", "counter", s.num_preemptions_total),
            ("vllm:prefix_cache_queries_total", "counter", s.prefix_cache_queries_total),
            ("vllm:prefix_cache_hits_total", "counter", s.prefix_cache_hits_total),
            ("vllm:prompt_tokens_total", "counter", s.prompt_tokens_total),
            ("vllm:generation_tokens_total", "counter", s.generation_tokens_total),
            ("vllm:request_success_total", "counter", self.request_success),
            ("vllm:cache_config_info", "gauge", 1),
        ]
        out = []
        for name, kind, value in rows:
            base = name[:-6] if name.endswith("_total") else name
            out.append(f"# TYPE {base} {kind}")
            if name == "vllm:cache_config_info":
                m = self.core.memory
                out.append(f'{name}{{block_size="{m.block_size}",num_gpu_blocks="{m.num_blocks}",'
                           f'model_name="{self.served_model_name}",engine="0"}} 1')
            else:
                out.append(f"{name}{labels} {float(value)}")
        return "\n".join(out) + "\n"

    def facts(self) -> dict[str, Any]:
        m = self.core.memory
        return {"kv_cache_tokens": m.kv_tokens, "kv_cache_gib": m.kv_bytes / 2**30,
                "num_gpu_blocks": m.num_blocks, "block_size": m.block_size,
                "weights_gib": m.weight_bytes_per_gpu / 2**30}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "BadRequestError" if status < 500 else "InternalError",
                                   "code": status}}, status_code=status)


def build_ingress_class():
    """The FastAPI-ingress class Serve wraps (routes bound to a SimServer instance)."""
    from ray import serve

    api = FastAPI()

    @serve.ingress(api)
    class SimLLMServer(SimServer):
        @api.get("/health")
        async def health(self):
            if self.loop_error is not None:
                return _error(500, f"engine dead: {self.loop_error!r}")
            return Response(status_code=200)

        @api.get("/v1/models")
        async def models(self):
            return JSONResponse({"object": "list", "data": [{
                "id": self.served_model_name, "object": "model", "created": self.created,
                "owned_by": "orchestrator-sim", "max_model_len": self.args.max_model_len}]})

        @api.post("/v1/completions")
        async def completions(self, request: Request):
            return await self.handle(request, chat=False)

        @api.post("/v1/chat/completions")
        async def chat(self, request: Request):
            return await self.handle(request, chat=True)

        @api.get("/metrics")
        async def metrics(self):
            return PlainTextResponse(self.metrics_text())

        @api.get("/engine_facts")
        async def engine_facts(self):
            return JSONResponse(self.facts())

        def check_health(self):
            if self.loop_error is not None:
                raise RuntimeError(f"engine loop died: {self.loop_error!r}")

    return SimLLMServer
