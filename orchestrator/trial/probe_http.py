"""The probe's requests: many completions bodies to one OpenAI-compatible endpoint, a few at a time,
each answer parsed or its failure named (secrets scrubbed), in the bodies' order."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, Optional, Sequence

import aiohttp

from orchestrator.loadgen import Endpoint


async def post_all(base_url: str, model: str, bodies: Sequence[dict], parse: Callable[[dict, dict], Any],
                   failed: Callable[[str], Any], *, concurrency: int, timeout_s: float,
                   api_key: Optional[str]) -> list:
    """POST every body to the completions endpoint, ``concurrency`` at a time: ``parse(payload, body)`` of
    each answer in the bodies' order, or ``failed(message)`` for a request that failed."""


    endpoint = Endpoint(base_url, model, api="completions", api_key=api_key)  # its URL join, headers, scrub
    gate = asyncio.Semaphore(concurrency)

    async def one(session, body: dict):
        async with gate:
            try:
                async with session.post(endpoint.url, json=body, headers=endpoint.headers()) as resp:
                    text = await resp.text()
                    if resp.status != 200:
                        return failed(endpoint.scrub(f"HTTP {resp.status}: {text}")[:300])
                    return parse(json.loads(text), body)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, IndexError, TypeError) as e:
                return failed(endpoint.scrub(f"{type(e).__name__}: {e}")[:300])

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        return list(await asyncio.gather(*(one(session, b) for b in bodies)))
