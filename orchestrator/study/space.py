"""Search space: typed parameters named as vLLM engine arguments, with conditions.

YAML forms (under ``space:``)::

    max_num_seqs: {type: int, low: 8, high: 512, log: true}
    gpu_memory_utilization: {type: float, low: 0.80, high: 0.95, step: 0.05}
    kv_cache_dtype: [auto, fp8]                 # a list is a categorical
    enforce_eager: false                        # a scalar is fixed
    max_num_batched_tokens: {type: categorical, choices: [2048, 8192],
                             when: {enable_chunked_prefill: true}}

``when`` makes a parameter exist only when other parameters have one of the given
values. The space compiles to an Optuna define-by-run function
(:meth:`SearchSpace.suggest`), parents before children. :func:`space_problems` is the
one check of a space against vLLM's engine arguments: the study file's report and
:class:`SearchSpace` itself both use it.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, RootModel, TypeAdapter, ValidationError, field_validator,
                      model_validator)

from orchestrator.hardware.engine_args import ENGINE_ARG_RULES, unknown_engine_arg, validate_engine_arg
from orchestrator.study.errors import LocatedError, Problem, allowed_keys, models_by_tag, problems_from_validation

Scalar = Union[bool, int, float, str, None]


class _Param(BaseModel):
    # .inf and .nan are lost in a JSON round trip of the study and mean no setting here
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    when: Optional[dict[str, Union[Scalar, list[Scalar]]]] = Field(
        default=None, description="exists only when each named parameter has (one of) the given value(s)")

    def active(self, values: dict[str, Any]) -> bool:
        if not self.when:
            return True
        for name, expected in self.when.items():
            if name not in values:
                return False
            allowed = expected if isinstance(expected, list) else [expected]
            if values[name] not in allowed:
                return False
        return True


class IntParam(_Param):
    type: Literal["int"] = "int"
    low: int
    high: int
    step: int = Field(default=1, ge=1)
    log: bool = False

    @model_validator(mode="after")
    def _check(self):
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        if self.log and (self.low < 1 or self.step != 1):
            raise ValueError("log: true needs low >= 1 and step 1")
        return self

    def values(self) -> list[Any]:
        if self.log:
            # Grid for a log-scale int: powers of two inside [low, high] plus both ends.
            pts = {self.low, self.high}
            p = 1
            while p <= self.high:
                if p >= self.low:
                    pts.add(p)
                p *= 2
            return sorted(pts)
        return list(range(self.low, self.high + 1, self.step))

    def suggest(self, trial, name: str):
        return trial.suggest_int(name, self.low, self.high, step=self.step, log=self.log)

    def allows(self, value: Any) -> bool:
        return (isinstance(value, int) and not isinstance(value, bool) and self.low <= value <= self.high
                and (self.log or (value - self.low) % self.step == 0))

    def allowed(self) -> str:
        steps = f" in steps of {self.step} from {self.low}" if self.step != 1 and not self.log else ""
        return f"an integer in [{self.low}, {self.high}]{steps}"


class FloatParam(_Param):
    type: Literal["float"] = "float"
    low: float
    high: float
    step: Optional[float] = Field(default=None, gt=0)
    log: bool = False

    @model_validator(mode="after")
    def _check(self):
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        if self.log and (self.low <= 0 or self.step is not None):
            raise ValueError("log: true needs low > 0 and no step")
        return self

    def values(self) -> list[Any]:
        if self.step is not None:
            n = int(math.floor((self.high - self.low) / self.step + 1e-9))
            return [round(self.low + i * self.step, 10) for i in range(n + 1)]
        if self.log:
            return [self.low * (self.high / self.low) ** (i / 4) for i in range(5)]
        return [self.low + (self.high - self.low) * i / 4 for i in range(5)]

    def suggest(self, trial, name: str):
        return trial.suggest_float(name, self.low, self.high, step=self.step, log=self.log)

    def allows(self, value: Any) -> bool:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return False
        if not self.low <= value <= self.high:
            return False
        if self.step is None:
            return True
        k = (value - self.low) / self.step
        return abs(k - round(k)) < 1e-8  # Optuna's own test for a stepped float

    def allowed(self) -> str:
        steps = f" in steps of {self.step:g} from {self.low:g}" if self.step is not None else ""
        return f"a number in [{self.low:g}, {self.high:g}]{steps}"


class CategoricalParam(_Param):
    type: Literal["categorical"] = "categorical"
    choices: list[Scalar] = Field(min_length=1)

    @field_validator("choices")
    @classmethod
    def _unique(cls, v):
        seen = []
        for c in v:
            if any(type(c) is type(s) and c == s for s in seen):
                raise ValueError(f"duplicate choice {c!r}")
            seen.append(c)
        return v

    def values(self) -> list[Any]:
        return list(self.choices)

    def suggest(self, trial, name: str):
        return trial.suggest_categorical(name, self.choices)

    def allows(self, value: Any) -> bool:
        return any(_same(c, value) for c in self.choices)

    def allowed(self) -> str:
        return "one of " + json.dumps(self.choices)


class FixedParam(_Param):
    type: Literal["fixed"] = "fixed"
    value: Scalar

    def values(self) -> list[Any]:
        return [self.value]

    def suggest(self, trial, name: str):
        return self.value

    def allows(self, value: Any) -> bool:
        return _same(self.value, value)

    def allowed(self) -> str:
        return "the fixed value " + json.dumps(self.value)


def value_count(p) -> int:
    """How many values ``p.values()`` lists, without listing a wide range (an int over 1..65536)."""
    if isinstance(p, IntParam) and not p.log:
        return len(range(p.low, p.high + 1, p.step))
    if isinstance(p, FloatParam) and p.step is not None:
        return int(math.floor((p.high - p.low) / p.step + 1e-9)) + 1
    return len(p.values())


def pick_value(p, rng) -> Any:
    """``rng.choice(p.values())`` (the same draw), without listing a wide integer range."""
    if isinstance(p, IntParam) and not p.log:
        return rng.randrange(p.low, p.high + 1, p.step)
    return rng.choice(p.values())


def _same(a: Any, b: Any) -> bool:
    """Equal, and not a bool standing in for a number (``True == 1`` in Python, not in a study)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return a == b


ParamSpec = Annotated[Union[IntParam, FloatParam, CategoricalParam, FixedParam], Field(discriminator="type")]
PARAM_TYPES = models_by_tag(ParamSpec, "type")
_PARAM = TypeAdapter(ParamSpec)


def _shorthand(value: Any) -> Any:
    if isinstance(value, list):
        return {"type": "categorical", "choices": value}
    if not isinstance(value, dict):
        return {"type": "fixed", "value": value}
    return value


def space_problems(raw: dict) -> list[Problem]:
    """Every problem of a ``space`` mapping, each at its key path (``space.NAME...``).

    Each name must be a tunable engine argument, each entry a valid parameter whose values
    (bounds, choices or the fixed value) the argument allows, and each condition on a
    parameter of the space; then no parameter may depend on itself or in a cycle.
    """
    problems: list[Problem] = []
    parsed = {}
    for name, value in raw.items():
        why = unknown_engine_arg(name, named=False)
        if why:
            problems.append(Problem(f"space.{name}", why))
            continue
        entry = _shorthand(value)
        try:
            p = _PARAM.validate_python(entry)
        except ValidationError as err:
            problems += _entry_problems(name, entry, err)
            continue
        parsed[name] = p
        for v in _bounds_to_check(p):
            why = validate_engine_arg(name, v)
            if why:
                problems.append(Problem(f"space.{name}", f"value not allowed for {name}: {why}", v, True))
                break
    for name, p in parsed.items():
        for other in (p.when or {}):
            if other not in raw:
                problems.append(Problem(f"space.{name}.when.{other}", "condition on an unknown parameter; parameters: "
                                        + ", ".join(map(str, raw))))
    if not problems:
        try:
            for name, p in parsed.items():
                if name in (p.when or {}):
                    raise ValueError(f"{name}.when: a parameter cannot depend on itself")
            _ordered(parsed)
        except ValueError as e:
            problems.append(Problem("space", str(e)))
    return problems


def _entry_problems(name: str, entry: Any, err: ValidationError) -> list[Problem]:
    """One parameter's validation errors at ``space.NAME...``; an unknown key lists its type's keys."""
    out = []
    for pr in problems_from_validation(err, entry, model_at=lambda data, loc: None):
        path = f"space.{name}" + (f".{pr.path}" if pr.path else "")
        if pr.path and pr.message.startswith("unknown key"):
            model = PARAM_TYPES.get(entry.get("type")) if isinstance(entry, dict) else None
            allowed = allowed_keys(model) if model else []
            out.append(Problem(path, "unknown key" + (f"; allowed: {', '.join(allowed)}" if allowed else "")))
        else:
            out.append(Problem(path, pr.message, pr.value, pr.has_value))
    return out


def _ordered(params: dict[str, Any]) -> list[str]:
    """Parameters with every condition's parents first (stable otherwise); raises on a cycle."""
    order: list[str] = []
    state: dict[str, int] = {}

    def visit(n: str, path: tuple[str, ...]):
        if state.get(n) == 2:
            return
        if state.get(n) == 1:
            raise ValueError("conditions form a cycle: " + " -> ".join(path + (n,)))
        state[n] = 1
        for parent in (params[n].when or {}):
            visit(parent, path + (n,))
        state[n] = 2
        order.append(n)

    for n in params:
        visit(n, ())
    return order


class SearchSpace(RootModel[dict[str, ParamSpec]]):
    """Ordered parameters; validated against vLLM's engine arguments (:func:`space_problems`)."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _expand(cls, data):
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise ValueError("expected a mapping of engine argument name to parameter")
        problems = space_problems(data)
        if problems:
            raise LocatedError(problems)
        return {k: _shorthand(v) for k, v in data.items()}

    @property
    def params(self) -> dict[str, Any]:
        return self.root

    def ordered_names(self) -> list[str]:
        """Parameters with every condition's parents first (stable otherwise)."""
        return _ordered(self.root)

    def suggest(self, trial) -> dict[str, Any]:
        """Optuna define-by-run: sample active parameters; fixed ones are returned, not sampled."""
        values: dict[str, Any] = {}
        for name in self.ordered_names():
            p = self.root[name]
            if not p.active(values):
                continue
            values[name] = p.suggest(trial, name)
        return values

    def without(self, drop: dict[str, list[Any]]) -> "SearchSpace":
        """This space with the named categorical choices removed (a parameter keeps at least one)."""
        root = dict(self.root)
        for name, values in drop.items():
            p = root.get(name)
            if not isinstance(p, CategoricalParam):
                continue
            kept = [c for c in p.choices if not any(_same(c, v) for v in values)]
            if kept and len(kept) < len(p.choices):
                root[name] = p.model_copy(update={"choices": kept})
        return SearchSpace.model_construct(root=root)

    def sampled_names(self) -> list[str]:
        return [n for n, p in self.root.items() if not isinstance(p, FixedParam)]

    def grid(self) -> list[dict[str, Any]]:
        """Every combination of parameter values (conditions applied, duplicates dropped)."""
        names = self.ordered_names()
        points: list[dict[str, Any]] = [{}]
        for name in names:
            p = self.root[name]
            nxt = []
            for pt in points:
                if p.active(pt):
                    nxt += [{**pt, name: v} for v in p.values()]
                else:
                    nxt.append(pt)
            points = nxt
        seen, out = set(), []
        for pt in points:
            key = tuple(sorted((k, repr(v)) for k, v in pt.items()))
            if key not in seen:
                seen.add(key)
                out.append(pt)
        return out

    def grid_size(self) -> int:
        return len(self.grid())

    def grid_bound(self) -> int:
        """The grid's size without listing it: the product of the value counts (an upper bound
        where conditions switch parameters off)."""
        return math.prod(value_count(p) for p in self.root.values())

    def column_types(self) -> dict[str, str]:
        """Arrow-friendly type of each parameter column: bool, int, float or string."""
        out = {}
        for name, p in self.root.items():
            rule = ENGINE_ARG_RULES[name]
            if rule.kind in ("int", "float", "bool"):
                out[name] = rule.kind
            else:
                vals = [v for v in p.values() if v is not None]
                if vals and all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
                    out[name] = "int"
                else:
                    out[name] = "string"
        return out


def _bounds_to_check(p) -> list[Any]:
    if isinstance(p, (IntParam, FloatParam)):
        return [p.low, p.high]
    if isinstance(p, CategoricalParam):
        return list(p.choices)
    return [p.value]


