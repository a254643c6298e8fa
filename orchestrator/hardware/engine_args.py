"""The one place where a trial's parameters become vLLM engine arguments.

Search-space parameters are named exactly as vLLM's engine arguments. This module
knows which arguments exist, which values each accepts, the defaults vLLM applies
when an argument is left out, and how an argument set is written for the three
consumers: ``ray.serve.llm`` ``engine_kwargs``, the ``vllm serve`` command line and
the simulated engine.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Literal, Optional

from orchestrator.redaction import EnvRef, env_references, shell_line

# vLLM's default fraction of device memory the engine may claim (0.26 and 0.29).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")
QUANTIZATION_METHODS = (None, "fp8", "awq", "awq_marlin", "gptq", "gptq_marlin", "bitsandbytes",
                        "compressed-tensors", "modelopt", "experts_int8")
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
DTYPES = ("auto", "bfloat16", "float16", "float32", "half", "float")
SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass(frozen=True)
class ArgRule:
    """What one engine argument accepts."""

    kind: Literal["int", "float", "bool", "choice", "path"]
    help: str
    choices: tuple = ()
    low: float | None = None
    high: float | None = None
    check: Callable[[Any], bool] | None = None
    check_text: str = ""

    def describe(self) -> str:
        if self.kind == "bool":
            return "true or false"
        if self.kind == "choice":
            return "one of " + ", ".join("null" if c is None else repr(c) for c in self.choices)
        if self.kind == "path":
            return "a model directory or name, or null"
        lo = "" if self.low is None else f">= {self.low:g}"
        hi = "" if self.high is None else f"<= {self.high:g}"
        bounds = " and ".join(x for x in (lo, hi) if x)
        text = f"{'an integer' if self.kind == 'int' else 'a number'}" + (f" {bounds}" if bounds else "")
        return text + (f", {self.check_text}" if self.check_text else "")

    def validate(self, value: Any) -> str | None:
        """Return why ``value`` is not accepted, or None."""
        if self.kind == "bool":
            return None if isinstance(value, bool) else f"expected {self.describe()}"
        if self.kind == "choice":
            return None if value in self.choices else f"expected {self.describe()}"
        if self.kind == "path":
            ok = value is None or (isinstance(value, str) and bool(value.strip()))
            return None if ok else f"expected {self.describe()}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"expected {self.describe()}"
        if self.kind == "int" and not float(value).is_integer():
            return f"expected {self.describe()}"
        if self.low is not None and value < self.low:
            return f"expected {self.describe()}"
        if self.high is not None and value > self.high:
            return f"expected {self.describe()}"
        if self.check is not None and not self.check(value):
            return f"expected {self.describe()}"
        return None


def _power_of_two(v: Any) -> bool:
    v = int(v)
    return v >= 1 and (v & (v - 1)) == 0


ENGINE_ARG_RULES: dict[str, ArgRule] = {
    "max_num_seqs": ArgRule("int", "most sequences in one engine step", low=1, high=65536),
    "max_num_batched_tokens": ArgRule("int", "token budget of one engine step", low=16, high=1 << 20),
    "gpu_memory_utilization": ArgRule("float", "fraction of device memory vLLM may claim", low=0.05, high=1.0),
    "max_model_len": ArgRule("int", "longest sequence (prompt + output) served", low=16, high=1 << 22),
    "kv_cache_dtype": ArgRule("choice", "KV cache element type", choices=KV_CACHE_DTYPES),
    "block_size": ArgRule("choice", "tokens per paged KV block", choices=BLOCK_SIZES),
    "enable_chunked_prefill": ArgRule("bool", "split long prefills across steps"),
    "enable_prefix_caching": ArgRule("bool", "reuse KV blocks of shared prefixes"),
    "enforce_eager": ArgRule("bool", "no torch.compile / CUDA graphs"),
    "quantization": ArgRule("choice", "weight quantization method", choices=QUANTIZATION_METHODS),
    "tensor_parallel_size": ArgRule("int", "GPUs a layer is split over", low=1, high=64,
                                    check=_power_of_two, check_text="a power of two"),
    "pipeline_parallel_size": ArgRule("int", "pipeline stages", low=1, high=64),
    "long_prefill_token_threshold": ArgRule("int", "cap on prefill tokens per request per step (0 = none)",
                                            low=0, high=1 << 20),
    "stream_interval": ArgRule("int", "tokens buffered per streamed chunk (host overhead vs smoothness)",
                               low=1, high=1024),
    "scheduling_policy": ArgRule("choice", "waiting-queue order", choices=SCHEDULING_POLICIES),
    "dtype": ArgRule("choice", "model compute dtype", choices=DTYPES),
    # Speculative decoding (vLLM's speculative_config): n-gram prompt lookup, or a draft model
    # when speculative_model names one; written as the one JSON argument vLLM takes (SPECULATIVE_ARGS).
    "num_speculative_tokens": ArgRule("int", "tokens proposed per step (0 = off)", low=0, high=16),
    "speculative_model": ArgRule("path", "draft model proposing the tokens, sharing the target's tokenizer "
                                 "(null: n-gram prompt lookup)"),
    "prompt_lookup_max": ArgRule("int", "longest n-gram matched in the prompt (speculation on)", low=1, high=16),
    "prompt_lookup_min": ArgRule("int", "shortest n-gram matched in the prompt (speculation on)", low=1, high=16),
    # ray.serve.llm's serving layer (engine.ingress: serve_llm): not vLLM arguments, but searched
    # like them, because through that ingress they bound what the engine can be measured to do.
    "num_ingress_replicas": ArgRule("int", "ray.serve.llm router replicas (ingress serve_llm only)",
                                    low=1, high=1024),
    "stream_batching_interval_ms": ArgRule("float", "ray.serve.llm stream batching window, ms "
                                           "(ingress serve_llm only)", low=0, high=10_000),
}

# Parameters of ray.serve.llm's serving layer, not of the engine: never on vLLM's command line.
SERVING_ARGS = ("num_ingress_replicas", "stream_batching_interval_ms")
# Folded into vLLM's ``speculative_config`` (the same JSON in 0.26 and 0.29), never passed alone.
SPECULATIVE_ARGS = ("num_speculative_tokens", "speculative_model", "prompt_lookup_max", "prompt_lookup_min")

TUNABLE_ENGINE_ARGS = tuple(ENGINE_ARG_RULES)


@dataclass(frozen=True)
class EngineArgs:
    """A complete vLLM engine configuration; ``None`` means "vLLM's default".

    Build it with :func:`engine_args_from_params`; fill vLLM's hardware-dependent
    defaults with :meth:`resolved`.
    """

    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    max_model_len: Optional[int] = None
    kv_cache_dtype: str = "auto"
    block_size: Optional[int] = None
    enable_chunked_prefill: Optional[bool] = None
    enable_prefix_caching: Optional[bool] = None
    enforce_eager: bool = False
    quantization: Optional[str] = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    long_prefill_token_threshold: int = 0
    stream_interval: int = 1
    scheduling_policy: str = "fcfs"
    dtype: str = "auto"
    # Speculation (SPECULATIVE_ARGS): off at 0; a draft model when speculative_model is set, else
    # n-gram prompt lookup, whose bounds default to vLLM's (5 and 5).
    num_speculative_tokens: int = 0
    speculative_model: Optional[str] = None
    prompt_lookup_max: Optional[int] = None
    prompt_lookup_min: Optional[int] = None
    # ray.serve.llm's serving layer (SERVING_ARGS); None: ray.serve.llm's default.
    num_ingress_replicas: Optional[int] = None
    stream_batching_interval_ms: Optional[float] = None
    # Not searchable: set by the engine/study, passed through as given.
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        """Accelerators one replica holds."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def resolved(self, *, device_memory_gib: float, device_name: str = "", platform: str = "cuda",
                 model_max_len: int | None = None, server: bool = True) -> "EngineArgs":
        """Fill the defaults vLLM chooses for this hardware (``engine/arg_utils.py``).

        OpenAI server defaults: >=70 GiB GPUs other than A100 get 8192 tokens /
        1024 seqs; other GPUs 2048 / 256; CPU 2048 / 128 (x TP*PP). The offline
        ``LLM`` class uses larger token budgets. Chunked prefill and prefix caching
        are on by default; block size is 16 on GPUs and 128 on CPU.
        """
        if platform == "cpu":
            tokens, seqs = (2048, 128) if server else (4096, 256)
            tokens, seqs = tokens * self.gpus, seqs * self.gpus
        elif device_memory_gib >= 70 and "A100" not in device_name.upper():
            tokens, seqs = (8192, 1024) if server else (16384, 1024)
        else:
            tokens, seqs = (2048, 256) if server else (8192, 256)
        max_len = self.max_model_len or model_max_len
        chunked = True if self.enable_chunked_prefill is None else self.enable_chunked_prefill
        mnbt = self.max_num_batched_tokens if self.max_num_batched_tokens is not None else tokens
        if not chunked and max_len is not None and self.max_num_batched_tokens is None:
            mnbt = max(mnbt, max_len)
        seqs = self.max_num_seqs if self.max_num_seqs is not None else min(seqs, mnbt)
        return replace(
            self,
            max_num_seqs=seqs,
            max_num_batched_tokens=mnbt,
            max_model_len=max_len,
            block_size=self.block_size or (128 if platform == "cpu" else 16),
            enable_chunked_prefill=chunked,
            enable_prefix_caching=True if self.enable_prefix_caching is None else self.enable_prefix_caching,
        )

    def explicit(self) -> dict[str, Any]:
        """Arguments that differ from "leave it to vLLM", as vLLM names them."""
        out: dict[str, Any] = {}
        defaults = EngineArgs()
        for f in fields(self):
            if f.name == "extra" or f.name in SERVING_ARGS or f.name in SPECULATIVE_ARGS:
                continue
            value = getattr(self, f.name)
            if value is None or value == getattr(defaults, f.name):
                continue
            out[f.name] = value
        if self.speculative_config() is not None:
            out["speculative_config"] = self.speculative_config()
        # gpu_memory_utilization is always written: vLLM's default changed across versions.
        out["gpu_memory_utilization"] = self.gpu_memory_utilization
        out.update(env_references(self.extra))  # hf_token_env: VAR -> hf_token, read when the engine starts
        return out

    def speculative_config(self) -> Optional[dict[str, Any]]:
        """vLLM's ``speculative_config``: a draft model's, n-gram prompt lookup's, or None when
        speculation is off. The lookup bounds apply to n-gram speculation only."""
        if not self.num_speculative_tokens:
            return None
        if self.speculative_model:
            return {"method": "draft_model", "model": self.speculative_model,
                    "num_speculative_tokens": self.num_speculative_tokens}
        config: dict[str, Any] = {"method": "ngram", "num_speculative_tokens": self.num_speculative_tokens}
        for name in ("prompt_lookup_max", "prompt_lookup_min"):
            if getattr(self, name) is not None:
                config[name] = getattr(self, name)
        return config

    def serving(self) -> dict[str, Any]:
        """The ray.serve.llm serving-layer settings that differ from its defaults."""
        return {name: getattr(self, name) for name in SERVING_ARGS if getattr(self, name) is not None}

    def to_engine_kwargs(self) -> dict[str, Any]:
        """``engine_kwargs`` for ``ray.serve.llm.LLMConfig`` (same names as ``AsyncEngineArgs``)."""
        return self.explicit()

    def cli_words(self) -> list[Any]:
        """Flags for ``vllm serve`` (booleans as ``--flag`` / ``--no-flag``); a value read from the
        environment when the engine starts stays an :class:`~orchestrator.redaction.EnvRef`."""
        words: list[Any] = []
        for name, value in self.explicit().items():
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                words.append(flag if value else "--no-" + name.replace("_", "-"))
            elif isinstance(value, (dict, list)):
                words += [flag, json.dumps(value)]
            else:
                words += [flag, value if isinstance(value, EnvRef) else str(value)]
        return words

    def to_cli_args(self) -> list[str]:
        """Flags for ``vllm serve``, as strings."""
        return [str(w) for w in self.cli_words()]

    def to_cli(self, model: str) -> str:
        """The ``vllm serve`` command as a shell line (secrets ``***``, environment references expanded by the shell)."""
        return shell_line(["vllm", "serve", model, *self.cli_words()])


def vllm_refusal(args: EngineArgs) -> str | None:
    """Why vLLM refuses to start with these (resolved) arguments, in its own words, or None.

    vLLM's ``SchedulerConfig.verify_max_model_len`` (0.26 and 0.29): checked before anything is
    loaded, so the pre-flight and the simulator refuse exactly what vLLM refuses.
    """
    mnbt, seqs, max_len = args.max_num_batched_tokens, args.max_num_seqs, args.max_model_len
    if mnbt is None or seqs is None or max_len is None:
        return None
    if mnbt < max_len and args.enable_chunked_prefill is False:
        return (f"max_num_batched_tokens ({mnbt}) is smaller than max_model_len ({max_len}). This effectively "
                "limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer "
                "sequences. Please increase max_num_batched_tokens or decrease max_model_len.")
    if mnbt < seqs:
        return f"max_num_batched_tokens ({mnbt}) must be greater than or equal to max_num_seqs ({seqs})."
    lo, hi = args.prompt_lookup_min, args.prompt_lookup_max
    if args.num_speculative_tokens and not args.speculative_model and lo is not None and hi is not None and lo > hi:
        return f"prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}"
    if args.long_prefill_token_threshold > max_len:
        return (f"long_prefill_token_threshold ({args.long_prefill_token_threshold}) cannot be greater than "
                f"the max_model_len ({max_len}).")
    return None


def unknown_engine_arg(name: Any, *, named: bool = True) -> str | None:
    """Why ``name`` is not an engine argument a study may set (naming the closest one), or None.

    ``named``: whether the message repeats the name (not when the key path already shows it).
    """
    if name in ENGINE_ARG_RULES:
        return None
    close = difflib.get_close_matches(str(name), TUNABLE_ENGINE_ARGS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (f"unknown engine argument{f' {name!r}' if named else ''}{hint}; "
            f"allowed: {', '.join(TUNABLE_ENGINE_ARGS)}")


def validate_engine_arg(name: str, value: Any) -> str | None:
    """Why ``value`` is not a valid value of engine argument ``name``, or None."""
    rule = ENGINE_ARG_RULES.get(name)
    if rule is None:
        return unknown_engine_arg(name, named=False)
    return rule.validate(value)


def engine_args_from_params(params: dict[str, Any], *, fixed: dict[str, Any] | None = None) -> EngineArgs:
    """Turn sampled parameters (plus the study's fixed engine args) into :class:`EngineArgs`.

    ``fixed`` holds pass-through arguments that are not searched (e.g. ``load_format``);
    searched parameters win over fixed ones of the same name.
    """
    known = {f.name for f in fields(EngineArgs)} - {"extra"}
    merged = {**(fixed or {}), **params}
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for name, value in merged.items():
        if name in known:
            rule = ENGINE_ARG_RULES.get(name)
            if rule is not None and rule.kind == "int" and value is not None:
                value = int(value)
            if rule is not None and rule.kind == "float" and value is not None:
                value = float(value)
            kwargs[name] = value
        else:
            extra[name] = value
    if kwargs.get("gpu_memory_utilization") is None:
        kwargs.pop("gpu_memory_utilization", None)
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        if kwargs.get(name) is None:
            kwargs.pop(name, None)
    return EngineArgs(**kwargs, extra=extra)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(x: float, step: int) -> int:
    return int(math.ceil(x / step) * step)
