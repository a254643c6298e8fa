"""Prompt datasets from other tools: ShareGPT conversations and ``vllm bench serve`` custom JSONL.

Both become :class:`~orchestrator.workload.trace.TraceEntry` lists without
timestamps (arrivals come from ``workload.arrival``); ``format: trace`` reads one of
our traces the same way, keeping only its lengths and prompts.

* ShareGPT (``format: sharegpt``): a JSON list (or JSONL) of
  ``{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}, ...]}``.
  As in ``vllm bench serve``, the first turn is the prompt and the second the
  completion; entries with fewer than two turns are skipped.
* vLLM custom (``format: vllm-custom``): JSONL of ``{"prompt": ..., "output_tokens": N}``
  (``vllm bench serve --dataset-name custom``); other keys are ignored, as vLLM does.

Token counts: no tokenizer is loaded here. The output length of a ShareGPT reply is
its number of whitespace-separated words (a rough token count); the prompt is sent
as text, the server counts its tokens, and metrics use the server's ``usage``.
Set ``dataset.output_len`` to ask every request for a fixed number of tokens instead.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Optional, Union

from orchestrator.workload.trace import TraceEntry, TraceError, read_trace

__all__ = ["read_sharegpt", "read_vllm_custom", "read_dataset", "write_vllm_custom"]


def _load_json_or_jsonl(path: Union[str, os.PathLike]) -> list[tuple[int, object]]:
    """``(position, object)`` pairs: list entries (1-based) of a JSON list, or lines of JSONL."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a UTF-8 text file") from None
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise TraceError(f"{path}:{e.lineno}: not valid JSON: {e.msg} (column {e.colno})") from None
        return list(enumerate(data, start=1))
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((n, json.loads(line)))
        except json.JSONDecodeError as e:
            raise TraceError(f"{path}:{n}: not valid JSON: {e.msg} (column {e.colno})") from None
    return out


def _words(text: str) -> int:
    return len(text.split())


def read_sharegpt(path: Union[str, os.PathLike], output_len: Optional[int] = None) -> list[TraceEntry]:
    entries = []
    for pos, obj in _load_json_or_jsonl(path):
        where = f"{path}:{pos}"
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: expected an object with 'conversations', got {type(obj).__name__}")
        conv = obj.get("conversations", obj.get("conversation"))
        if not isinstance(conv, list):
            raise TraceError(f"{where}: 'conversations' must be a list of turns")
        if len(conv) < 2:
            continue  # as vLLM: a prompt without a reply is not a request
        turns = []
        for t in conv[:2]:
            value = t.get("value") if isinstance(t, dict) else None
            if not isinstance(value, str):
                raise TraceError(f"{where}: a turn must be an object with a string 'value'")
            turns.append(value)
        prompt, reply = turns
        if not prompt.strip():
            continue
        n_out = output_len or max(1, _words(reply))
        entries.append(TraceEntry(output_len=n_out, prompt=prompt, line=pos))
    if not entries:
        raise TraceError(f"{path}: no conversation with a prompt and a reply")
    return entries


def read_vllm_custom(path: Union[str, os.PathLike], output_len: Optional[int] = None) -> list[TraceEntry]:
    entries = []
    for pos, obj in _load_json_or_jsonl(path):
        where = f"{path}:{pos}"
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: expected a JSON object with 'prompt', got {type(obj).__name__}")
        prompt = obj.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise TraceError(f"{where}: 'prompt' must be a non-empty string")
        n_out = output_len
        if n_out is None:
            raw = obj.get("output_tokens")
            if raw is None:
                raise TraceError(f"{where}: 'output_tokens' is missing (or set dataset.output_len)")
            if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not float(raw).is_integer() or raw < 1:
                raise TraceError(f"{where}: 'output_tokens' must be an integer >= 1 (got {raw!r})")
            n_out = int(raw)
        entries.append(TraceEntry(output_len=n_out, prompt=prompt, line=pos))
    if not entries:
        raise TraceError(f"{path}: no requests in the file")
    return entries


def read_dataset(fmt: str, path: Union[str, os.PathLike], output_len: Optional[int] = None) -> list[TraceEntry]:
    """The entries of a dataset file in ``fmt`` (sharegpt, vllm-custom or trace)."""
    if fmt == "sharegpt":
        return read_sharegpt(path, output_len)
    if fmt == "vllm-custom":
        return read_vllm_custom(path, output_len)
    if fmt == "trace":
        entries = read_trace(path, need_timestamp=False)
        if output_len is not None:
            entries = [replace(e, output_len=output_len) for e in entries]
        return entries
    raise ValueError(f"unknown dataset format {fmt!r}; allowed: sharegpt, vllm-custom, trace")


def write_vllm_custom(path: Union[str, os.PathLike], prompts: Iterable[tuple[str, int]]) -> int:
    """``(prompt text, output tokens)`` pairs as ``vllm bench serve`` custom JSONL; returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for prompt, out in prompts:
            f.write(json.dumps({"prompt": prompt, "output_tokens": int(out)}) + "\n")
            n += 1
    os.replace(tmp, path)
    return n
