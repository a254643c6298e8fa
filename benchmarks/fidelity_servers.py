"""The servers benchmarks/loadgen_fidelity.py measures against, each in a process of its own:
CPU vLLM (``vllm serve`` with the tiny model), the sim engine's direct server, and a stub that
streams on a fixed schedule and reports what it really did (the ground truth).

    python benchmarks/fidelity_servers.py --serve-sim | --serve-stub   # a child process: port on stdout
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = "tiny"


class Server:
    """A server process in its own session, stopped by its process group (only what we started)."""

    def __init__(self, argv: list[str], env: dict, log: Path, port_on_stdout: bool = False):
        self.log = open(log, "wb")
        # stdout goes to the log too (a pipe nobody reads fills up and blocks the server), except for
        # a server that prints its port on its first line and nothing after it.
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE if port_on_stdout else self.log,
                                     stderr=self.log, start_new_session=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def wait_models(url: str, timeout_s: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f} s")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_vllm(model_dir: Path, tmp: Path) -> tuple[Server, str]:
    port = free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CACHE_ROOT=str(tmp / "vllm"),
               TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"), HF_HOME=str(tmp / "hf"), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--enforce-eager", "--max-model-len", "512", "--max-num-seqs", "32", "--disable-log-stats",
            "--no-enable-prefix-caching"]  # every run resends the same prompts: no tool may profit from another
    server = Server(argv, env, tmp / "vllm.log")
    url = f"http://127.0.0.1:{port}"
    wait_models(url, 600, server.proc)
    return server, url


def serve_sim() -> None:
    """Child process: the sim engine's direct server on a free port (printed), until killed."""
    from orchestrator.engines.sim.http_server import build_sim_frontend, start_direct_server
    from orchestrator.hardware.engine_args import EngineArgs
    from orchestrator.models.shapes import find_model_config

    cfg = json.loads(find_model_config("llama-3.1-8b").read_text())
    args = EngineArgs(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=8192, block_size=16,
                      enable_chunked_prefill=True, enable_prefix_caching=False)
    front = build_sim_frontend(model_config=cfg, model_name="llama-3.1-8b", gpu="H100-80GB",
                               engine_args={k: getattr(args, k) for k in args.__dataclass_fields__},
                               calibration={}, served_model_name=MODEL)
    port = asyncio.run_coroutine_threadsafe(start_direct_server(front), front.rt.loop).result(30)
    print(port, flush=True)
    while True:
        time.sleep(3600)


STUB_TTFT_S, STUB_ITL_S = 0.020, 0.010


def serve_stub() -> None:
    """Child process: streams ``max_tokens`` chunks, first after 20 ms, then every 10 ms; ``/stats``
    gives what it really did (server-side first-token delay and gaps, from receipt of the request)."""
    from aiohttp import web

    ttfts: list[float] = []
    gaps: list[float] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        t0 = time.perf_counter()
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        last = None
        for i in range(int(body.get("max_tokens") or 16)):
            await asyncio.sleep(STUB_TTFT_S if i == 0 else STUB_ITL_S)
            chunk = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": f" w{i}"}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            now = time.perf_counter()
            if last is None:
                ttfts.append(now - t0)
            else:
                gaps.append(now - last)
            last = now
        n = int(body.get("max_tokens") or 16)
        usage = {"id": "x", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}}
        await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def stats(_: web.Request) -> web.Response:
        if not ttfts or not gaps:
            return web.json_response({})
        out = {"ttft_p50_ms": float(np.percentile(ttfts, 50) * 1000), "ttft_p99_ms": float(np.percentile(ttfts, 99) * 1000),
               "itl_p50_ms": float(np.percentile(gaps, 50) * 1000), "itl_p99_ms": float(np.percentile(gaps, 99) * 1000)}
        ttfts.clear()
        gaps.clear()
        return web.json_response(out)

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL}]})

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        app.router.add_get("/v1/models", models)
        app.router.add_get("/stats", stats)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        print(site._server.sockets[0].getsockname()[1], flush=True)  # noqa: SLF001
        await asyncio.Event().wait()

    asyncio.run(main())


def start_stub(tmp: Path) -> tuple[Server, str]:
    server = Server([sys.executable, __file__, "--serve-stub"], dict(os.environ), tmp / "stub.log",
                    port_on_stdout=True)
    url = f"http://127.0.0.1:{int(server.proc.stdout.readline())}"
    wait_models(url, 60, server.proc)
    return server, url


def stub_truth(url: str) -> dict:
    with urllib.request.urlopen(url + "/stats", timeout=10) as r:
        return json.loads(r.read())


def start_sim(tmp: Path) -> tuple[Server, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    server = Server([sys.executable, __file__, "--serve-sim"], env, tmp / "sim.log", port_on_stdout=True)
    port = int(server.proc.stdout.readline())
    url = f"http://127.0.0.1:{port}"
    wait_models(url, 60, server.proc)
    return server, url


if __name__ == "__main__":
    {"--serve-sim": serve_sim, "--serve-stub": serve_stub}[sys.argv[1]]()
