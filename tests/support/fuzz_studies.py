"""The fuzzers' strategies for study files (test_fuzz_study, test_fuzz_trace), shared with test_fuzz_runs,
which runs every file they draw that ``validate`` accepts."""

from __future__ import annotations

import copy
import json
import math

import yaml
from hypothesis import strategies as st

from conftest import BASE_STUDY

LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20), st.just("inf"), st.just(""), st.just("-1"),
)
JUNK = st.recursive(LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                    st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                    max_leaves=6)
KEYS = ["name", "seed", "engine", "model", "hardware", "workload", "space", "objectives", "constraints", "search",
        "budget", "output", "engine.kind", "engine.mode", "engine.faults", "engine.start_timeout_s",
        "engine.calibration", "hardware.gpu", "hardware.gpus_per_node", "workload.arrival", "workload.num_requests",
        "workload.output_len", "workload.input_len", "space.max_num_seqs", "space.max_num_batched_tokens",
        "space.max_num_seqs.low", "space.max_num_seqs.type", "search.sampler", "search.stages", "search.seed",
        "search.warm_start", "search.warm_start_trials", "search.n_startup_trials", "search.preflight",
        "search.initial_points", "budget.trials", "budget.max_concurrent_trials", "budget.trial_retries",
        "objectives.0", "constraints.0", "model.name"]
STAGES = st.lists(st.fixed_dictionaries({"params": st.lists(st.sampled_from(
    ["max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype", "nope"]), max_size=3)},
    optional={"trials": st.one_of(st.integers(-2, 30), LEAVES), "name": LEAVES, "extra": LEAVES}), max_size=3)
FAULTS = st.lists(st.fixed_dictionaries({"kind": st.sampled_from(["crash", "oom", "start_crash", "never_ready", "x"])},
                                        optional={"after_s": LEAVES, "after_requests": st.one_of(
                                            st.integers(-1, 5), LEAVES), "probability": LEAVES,
                                            "when": st.one_of(st.just({"max_num_seqs": 8}), st.just({"bad": 1}),
                                                              LEAVES)}), max_size=2)


def set_key(doc: dict, dotted: str, value) -> None:
    cur = doc
    parts = dotted.split(".")
    for p in parts[:-1]:
        nxt = cur.get(p) if isinstance(cur, dict) else None
        if isinstance(cur, list) and p.isdigit() and int(p) < len(cur):
            nxt = cur[int(p)]
        if not isinstance(nxt, (dict, list)):
            nxt = {}
            if isinstance(cur, dict):
                cur[p] = nxt
            else:
                return
        cur = nxt
    if isinstance(cur, dict):
        cur[parts[-1]] = value
    elif isinstance(cur, list) and parts[-1].isdigit() and int(parts[-1]) < len(cur):
        cur[int(parts[-1])] = value


@st.composite
def mutated_docs(draw):
    doc = copy.deepcopy(BASE_STUDY)
    doc["search"] = draw(st.fixed_dictionaries({}, optional={"stages": STAGES, "sampler": st.sampled_from(
        ["tpe", "grid", "gp", "nsga2", "random", "bogus"])}))
    if draw(st.booleans()):
        doc["engine"] = {"kind": "sim", "faults": draw(FAULTS)}
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(KEYS))
        if draw(st.integers(0, 4)) == 0:
            parent, _, leaf = key.rpartition(".")
            target = doc
            for p in parent.split(".") if parent else []:
                target = target.get(p) if isinstance(target, dict) else None
            if isinstance(target, dict):
                target.pop(leaf, None)
        else:
            set_key(doc, key, draw(JUNK))
    return doc


NUMERIC_KEYS = ["workload.arrival.rate", "workload.timeout_s", "workload.output_len", "workload.num_requests",
                "workload.warmup_s", "engine.startup_s", "max_error_rate", "seed"]
ODD_NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**12, 10**12),
                        st.sampled_from([0, 1, 2, 0.5, 1e-9, 1e308]))
# A request count the validator accepts is run in full: a million requests take minutes and ~9 GB
# in virtual time (~28 GB before prompt ids were shared objects: such a draw once ran a 2-core,
# 24 GiB machine out of memory). The odd counts are what this fuzz is for; valid ones stay small.
SMALL_RUN = 1000


def small_or_refused(v) -> bool:
    big = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and SMALL_RUN < v <= 10**6
    return not big


@st.composite
def runnable_candidates(draw):
    """A small virtual-time study with non-finite or extreme numbers, out-of-space initial points, and
    perhaps a key given twice in the YAML text."""
    doc = copy.deepcopy(BASE_STUDY)
    doc["engine"] = {"kind": "sim", "mode": "virtual"}
    doc["workload"] = {"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 8, "output_len": 8}
    for key in draw(st.lists(st.sampled_from(NUMERIC_KEYS), max_size=3, unique=True)):
        set_key(doc, key, draw(ODD_NUMBERS.filter(small_or_refused) if key == "workload.num_requests" else ODD_NUMBERS))
    if draw(st.booleans()):
        point = {"max_num_seqs": draw(st.one_of(st.integers(-5, 100000), st.floats(allow_nan=True),
                                                st.just("lots"))),
                 "max_num_batched_tokens": draw(st.sampled_from([2048, 8192, 4096, "x"]))}
        doc["search"] = {"initial_points": [point]}
    text = yaml.safe_dump(doc)
    if draw(st.booleans()):
        text += "seed: 7\n"  # a key given twice
    return text


VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True),
                   st.text(max_size=12), st.lists(st.integers(0, 5), max_size=3))
ENTRY = st.dictionaries(st.sampled_from(["timestamp", "input_len", "output_len", "prompt", "prefix_group",
                                         "prefix_len", "bogus"]), VALUES, max_size=5)
GOOD = st.builds(lambda t, i, o: {"timestamp": t, "input_len": i, "output_len": o},
                 st.floats(0, 100, allow_nan=False), st.integers(1, 500), st.integers(1, 200))
LINE = st.one_of(ENTRY.map(json.dumps), GOOD.map(json.dumps), st.text(max_size=30), st.just(""), st.just("{"))


def study_with_trace(name: str) -> dict:
    doc = copy.deepcopy(BASE_STUDY)
    doc["workload"] = {"trace": {"path": name}}
    return doc
