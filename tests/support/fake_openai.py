"""A real local HTTP server speaking the OpenAI streaming protocol, for load-generator tests.

The server (aiohttp, in a process of its own, on a random free port of 127.0.0.1)
streams ``max_tokens`` tokens with small sleeps, a usage chunk and ``[DONE]``. The
``model`` field picks a misbehaviour; ``model="script"`` picks it per request from
the first prompt token (see ``SCRIPT``). Timing knobs travel in the request body
(``Endpoint.extra_body``): ``fake_ttft_ms``, ``fake_itl_ms``, ``fake_split``.
Fixtures ``server`` (one per module) and ``fake`` (reset per test); helpers ``make_set``
and ``endpoint``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from typing import Optional

import pytest
from aiohttp import web

from orchestrator.loadgen import Endpoint
from orchestrator.workload.request_set import RequestSet
from orchestrator.workload.requests import Request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
API_KEY = "sk-test-SECRET-1234"
CHAT_TEMPLATE_TOKENS = 7  # the fake chat server counts words + this many
SCRIPT = {1: "stall", 2: "http500"}  # first prompt token -> behaviour, for model="script"


# ================================================================ the fake server
class FakeOpenAI:
    """The server side. Runs in a process of its own (see ``FakeServer``), so its CPU use
    does not perturb the client's timing; ``/_stats`` and ``/_reset`` expose its counters."""

    def __init__(self) -> None:
        self.models_calls = 0
        self._reset()

    def _reset(self) -> None:
        self.in_flight = 0 if not hasattr(self, "in_flight") else self.in_flight
        self.peak = self.in_flight
        self.started = 0
        self.bodies: list[dict] = []
        self.auth: list[Optional[str]] = []
        self.queries: list[str] = []

    def app(self) -> web.Application:
        app = web.Application()
        for prefix in ("", "/trial-3"):
            app.router.add_post(prefix + "/v1/completions", self.completions)
            app.router.add_post(prefix + "/v1/chat/completions", self.chat)
            app.router.add_get(prefix + "/v1/models", self.models)
        app.router.add_get("/slow/v1/models", self.slow_models)
        app.router.add_get("/_stats", self.stats)
        app.router.add_post("/_reset", self.reset)
        return app

    async def serve(self) -> None:
        runner = web.AppRunner(self.app(), handler_cancellation=True, shutdown_timeout=0.2, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        print(site._server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()

    # ---- routes
    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"peak": self.peak, "started": self.started, "bodies": self.bodies,
                                  "auth": self.auth, "queries": self.queries,
                                  "models_calls": self.models_calls})

    async def reset(self, request: web.Request) -> web.Response:
        self._reset()
        self.models_calls = 0
        return web.json_response({})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake"}]})

    async def slow_models(self, request: web.Request) -> web.Response:
        self.models_calls += 1
        if self.models_calls < 3:
            return web.Response(status=503, text="loading")
        return web.json_response({"object": "list", "data": []})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.auth.append(request.headers.get("Authorization"))
        self.queries.append(request.query_string)
        self.started += 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            return await self._respond(request, body, chat)
        finally:
            self.in_flight -= 1

    async def _respond(self, request: web.Request, body: dict, chat: bool) -> web.StreamResponse:
        if body["model"] == "serial":  # one request at a time: a server with a finite capacity
            if not hasattr(self, "lock"):
                self.lock = asyncio.Lock()
            async with self.lock:
                return await self._stream(request, dict(body, model="ok"), chat)
        return await self._stream(request, body, chat)

    async def _stream(self, request: web.Request, body: dict, chat: bool) -> web.StreamResponse:
        if chat:
            words = body["messages"][0]["content"].split()
            prompt_ids = [int(w[1:]) for w in words]
            prompt_tokens = len(words) + CHAT_TEMPLATE_TOKENS
            n = body["max_completion_tokens"]
        else:
            prompt_ids = body["prompt"]
            prompt_tokens = len(prompt_ids)
            n = body["max_tokens"]
        mode = body["model"]
        if mode == "script":
            mode = SCRIPT.get(prompt_ids[0], "ok")
        ttft = body.get("fake_ttft_ms", 20) / 1000
        itl = body.get("fake_itl_ms", 5) / 1000
        split = body.get("fake_split", False)

        if mode == "http500":  # echoes the Authorization header: the client must scrub it
            message = f"boom; you sent {request.headers.get('Authorization')} {body.get('padding', '')}"
            return web.json_response({"error": {"message": message}}, status=500)
        if mode == "json":  # ignores stream: true
            return web.json_response({"choices": [{"text": "x"}]})
        if mode == "stall":
            await asyncio.sleep(3600)

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        eol = b"\r\n" if split else b"\n"

        async def send(obj) -> None:
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + eol + eol
            if split:  # every event in two TCP writes, with a keep-alive comment first
                await resp.write(b": ping" + eol + eol + data[:7])
                await asyncio.sleep(0.001)
                await resp.write(data[7:])
            else:
                await resp.write(data)

        def token(i: int) -> dict:
            last = i == n - 1
            if chat:
                choice = {"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": "length" if last else None}
            else:
                choice = {"index": 0, "text": f" w{i}", "finish_reason": "length" if last else None}
            return {"id": "x", "object": "chunk", "choices": [choice]}

        if mode == "garbage":
            await resp.write(b"data: \x00\xff{{not json\n\n")
            return resp
        if chat and mode != "notokens":  # vLLM's first chunk: the role, no token
            await send({"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        await asyncio.sleep(ttft)
        emitted = 0
        if mode != "notokens":
            for i in range(n):
                if i:
                    await asyncio.sleep(itl)
                await send(token(i))
                emitted += 1
                if mode == "close" and i == 1:
                    request.transport.close()  # cut the connection mid-stream
                    return resp
                if mode == "stallmid" and i == 1:  # two tokens, then silence
                    await asyncio.sleep(3600)
                if mode == "garbagemid" and i == 1:  # two tokens, then a broken event
                    await resp.write(b"data: {\"choices\": [{\"text\": \x00\n\n")
                    return resp
                if mode == "streamerror" and i == 1:
                    await send({"error": {"message": "engine died", "type": "InternalServerError", "code": 500}})
                    await send(b"[DONE]")
                    return resp
        if mode != "nousage":
            await send({"id": "x", "choices": [], "usage": {
                "prompt_tokens": prompt_tokens, "completion_tokens": emitted, "total_tokens": prompt_tokens + emitted}})
        if mode != "nodone":
            await send(b"[DONE]")
        return resp


class FakeServer:
    """Test-side handle on a ``FakeOpenAI`` subprocess."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, env=env)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("fake server did not start")
        self.port = int(line)

    def url(self, prefix: str = "/trial-3") -> str:
        return f"http://127.0.0.1:{self.port}{prefix}"

    def _call(self, path: str, method: str = "GET") -> dict:
        req = urllib.request.Request(self.url("") + path, method=method, data=b"" if method == "POST" else None)
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.loads(resp.read())

    def stats(self) -> dict:
        return self._call("/_stats")

    def reset(self) -> None:
        self._call("/_reset", "POST")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(5)


@pytest.fixture(scope="module")
def server():
    srv = FakeServer()
    yield srv
    srv.stop()


@pytest.fixture
def fake(server):
    server.reset()
    return server


def make_set(n: int, *, rate: Optional[float] = None, output_len: int = 6, input_len: int = 12,
             warmup: int = 0, concurrency: Optional[int] = None, first_tokens: Optional[dict] = None) -> RequestSet:
    first_tokens = first_tokens or {}
    def req(i: int, warm: bool) -> Request:
        first = first_tokens.get(i, 100 + abs(i))
        return Request(index=i, arrival_s=0.0 if (warm or rate is None) else i / rate,
                       prompt_token_ids=(first,) + tuple(range(500, 500 + input_len - 1)),
                       output_len=output_len, warmup=warm)
    return RequestSet(warmup=tuple(req(i, True) for i in range(-warmup, 0)),
                      measured=tuple(req(i, False) for i in range(n)),
                      closed_loop_concurrency=concurrency)


def endpoint(fake: FakeServer, model: str = "ok", api: str = "completions", **extra) -> Endpoint:
    return Endpoint(fake.url(), model, api=api, api_key=API_KEY, extra_body=extra)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    asyncio.run(FakeOpenAI().serve())
