"""The sample traces shipped in ``search_spaces/traces/``, generated from fixed seeds.

``orchestrator make-traces DIR`` (or :func:`write_sample_traces`) rewrites them;
the test suite checks that the shipped files are exactly what this module produces.
Every trace uses input lengths (no text), so it replays on any model.

* ``chat``: Poisson at 4 req/s for a minute; short prompts behind a 64-token
  system prompt, answers of a few hundred tokens.
* ``rag``: 2 req/s; each prompt starts with one of 4 long shared contexts
  (2,048 tokens: a system prompt plus retrieved documents) and adds a question.
* ``summarisation``: 1 req/s of long documents (3-7k tokens) and short summaries.
* ``bursty``: chat-like lengths with gamma gaps of burstiness 0.2 (coefficient of
  variation 2.2): quiet spells, then bursts.
* ``long_input_burst``: light chat traffic plus, every 15 s, 12 requests within half
  a second whose prompt + output fill an 8,192-token ``max_model_len`` exactly: the
  prefill pile-up that stalls decodes and that ``max_num_batched_tokens``,
  chunked prefill and ``long_prefill_token_threshold`` are tuned for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Union

import numpy as np

from orchestrator.workload.trace import TraceEntry, write_trace

__all__ = ["SAMPLE_TRACES", "sample_trace", "write_sample_traces", "LONG_INPUT_MAX_MODEL_LEN"]

LONG_INPUT_MAX_MODEL_LEN = 8192


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, n: int, lo: int, hi: int) -> np.ndarray:
    mu = np.log(mean) - sigma ** 2 / 2
    return np.clip(np.rint(rng.lognormal(mu, sigma, n)), lo, hi).astype(int)


def _entries(ts, inputs, outputs, groups=None, prefix_len=None) -> list[TraceEntry]:
    out = []
    for i, (t, a, b) in enumerate(zip(ts, inputs, outputs)):
        g = None if groups is None or groups[i] < 0 else int(groups[i])
        out.append(TraceEntry(timestamp=round(float(t), 3), input_len=int(a), output_len=int(b),
                              prefix_group=g, prefix_len=prefix_len if g is not None else None))
    return out


def _chat() -> list[TraceEntry]:
    rng = np.random.default_rng(101)
    n = 240
    ts = np.concatenate(([0.0], np.cumsum(rng.exponential(1 / 4.0, n - 1))))
    inputs = 64 + _lognormal(rng, 250, 0.8, n, 8, 2000)
    outputs = _lognormal(rng, 220, 0.7, n, 8, 1024)
    groups = np.where(rng.random(n) < 0.8, 0, -1)  # most chats share the product's system prompt
    return _entries(ts, inputs, outputs, groups, prefix_len=64)


def _rag() -> list[TraceEntry]:
    rng = np.random.default_rng(202)
    n = 120
    ts = np.concatenate(([0.0], np.cumsum(rng.exponential(1 / 2.0, n - 1))))
    inputs = 2048 + _lognormal(rng, 300, 0.6, n, 16, 1500)
    outputs = _lognormal(rng, 180, 0.5, n, 16, 600)
    groups = rng.integers(0, 4, n)
    return _entries(ts, inputs, outputs, groups, prefix_len=2048)


def _summarisation() -> list[TraceEntry]:
    rng = np.random.default_rng(303)
    n = 60
    ts = np.concatenate(([0.0], np.cumsum(rng.exponential(1.0, n - 1))))
    inputs = rng.integers(3000, 7001, n)
    outputs = rng.integers(150, 401, n)
    return _entries(ts, inputs, outputs)


def _bursty() -> list[TraceEntry]:
    rng = np.random.default_rng(404)
    n = 300
    b = 0.2
    ts = np.concatenate(([0.0], np.cumsum(rng.gamma(b, 1 / (6.0 * b), n - 1))))
    inputs = _lognormal(rng, 400, 0.8, n, 8, 4000)
    outputs = _lognormal(rng, 150, 0.7, n, 8, 800)
    return _entries(ts, inputs, outputs)


def _long_input_burst() -> list[TraceEntry]:
    rng = np.random.default_rng(505)
    duration = 60.0
    bg = int(duration * 1.0)
    t_bg = np.sort(rng.uniform(0, duration, bg))
    bg_in = _lognormal(rng, 300, 0.7, bg, 8, 2000)
    bg_out = _lognormal(rng, 150, 0.6, bg, 8, 512)
    t_burst, b_in, b_out = [], [], []
    for start in np.arange(5.0, duration, 15.0):
        k = 12
        t_burst.append(start + np.sort(rng.uniform(0, 0.5, k)))
        out = rng.integers(64, 257, k)
        b_out.append(out)
        b_in.append(LONG_INPUT_MAX_MODEL_LEN - out)  # prompt + output == max_model_len
    ts = np.concatenate([t_bg] + t_burst)
    inputs = np.concatenate([bg_in] + b_in)
    outputs = np.concatenate([bg_out] + b_out)
    order = np.argsort(ts, kind="stable")
    ts = ts[order] - ts[order][0]
    return _entries(ts, inputs[order], outputs[order])


SAMPLE_TRACES: dict[str, Callable[[], list[TraceEntry]]] = {
    "chat": _chat,
    "rag": _rag,
    "summarisation": _summarisation,
    "bursty": _bursty,
    "long_input_burst": _long_input_burst,
}


def sample_trace(name: str) -> list[TraceEntry]:
    if name not in SAMPLE_TRACES:
        raise KeyError(f"unknown sample trace {name!r}; known: {', '.join(SAMPLE_TRACES)}")
    return SAMPLE_TRACES[name]()


def write_sample_traces(directory: Union[str, Path]) -> dict[str, Path]:
    """Write every sample trace as ``DIR/<name>.jsonl``; returns the paths."""
    out = {}
    for name in SAMPLE_TRACES:
        path = Path(directory) / f"{name}.jsonl"
        write_trace(path, sample_trace(name))
        out[name] = path
    return out
