"""Trace replay: shipped traces, time scaling and windows, prefix groups, text prompts, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from orchestrator.workload.generate import build_requests, text_token_ids, token_ids_to_text
from orchestrator.workload.samples import LONG_INPUT_MAX_MODEL_LEN, SAMPLE_TRACES, sample_trace, write_sample_traces
from orchestrator.workload.spec import WorkloadSpec
from orchestrator.workload.trace import TraceError, read_trace, select_window

VOCAB = 32_000


def write(tmp_path, lines, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join((json.dumps(x) if not isinstance(x, str) else x) + "\n" for x in lines))
    return path


def trace_spec(path, warmup: int = 0, **kw) -> WorkloadSpec:
    return WorkloadSpec.model_validate({"trace": {"path": str(path), **kw}, "warmup_requests": warmup})


# ---------------------------------------------------------------- shipped traces
def test_shipped_traces_are_what_the_generator_writes(repo, tmp_path):
    written = write_sample_traces(tmp_path)
    for name, path in written.items():
        shipped = repo / "search_spaces" / "traces" / f"{name}.jsonl"
        assert shipped.read_bytes() == path.read_bytes(), f"{shipped} is stale: run orchestrator make-traces"


@pytest.mark.parametrize("name", sorted(SAMPLE_TRACES))
def test_shipped_traces_replay_deterministically(name):
    spec = WorkloadSpec.model_validate({"trace": {"path": name}, "warmup_requests": 2})
    a, b = build_requests(spec, 5, VOCAB), build_requests(spec, 5, VOCAB)
    assert a == b
    entries = sample_trace(name)
    assert len(a.measured) == len(entries)
    assert [r.output_len for r in a.measured] == [e.output_len for e in sorted(entries, key=lambda e: e.timestamp)]
    # Another seed draws other prompt tokens, never other arrivals or lengths.
    c = build_requests(spec, 6, VOCAB)
    assert [r.arrival_s for r in c.measured] == [r.arrival_s for r in a.measured]
    assert [r.prompt_len for r in c.measured] == [r.prompt_len for r in a.measured]
    assert [r.prompt_token_ids for r in c.measured] != [r.prompt_token_ids for r in a.measured]


def test_long_input_burst_fills_max_model_len():
    rs = build_requests(WorkloadSpec.model_validate({"trace": {"path": "long_input_burst"}}), 0, VOCAB)
    full = [r for r in rs.measured if r.prompt_len + r.output_len == LONG_INPUT_MAX_MODEL_LEN]
    assert len(full) == 48  # 4 bursts of 12
    t = np.array([r.arrival_s for r in full])
    bursts = np.split(t, np.flatnonzero(np.diff(t) > 5) + 1)
    assert [len(b) for b in bursts] == [12] * 4
    assert all(b.max() - b.min() <= 0.5 for b in bursts)
    assert max(r.prompt_len + r.output_len for r in rs.measured) == LONG_INPUT_MAX_MODEL_LEN


def test_rag_trace_shares_long_prefixes():
    rs = build_requests(WorkloadSpec.model_validate({"trace": {"path": "rag"}}), 0, VOCAB)
    by_group: dict[int, set] = {}
    for r in rs.measured:
        by_group.setdefault(r.prefix_group, set()).add(r.prompt_token_ids[:2048])
    assert sorted(by_group) == [0, 1, 2, 3]
    assert all(len(p) == 1 for p in by_group.values())  # one prefix per group
    assert len({next(iter(p)) for p in by_group.values()}) == 4  # and four different ones


# ---------------------------------------------------------------- time scaling and windows
LINES = [{"timestamp": 100.0 + t, "input_len": 10, "output_len": 5} for t in (0, 1, 2, 4, 8, 16)]


def test_replay_times_are_gaps_times_scale(tmp_path):
    path = write(tmp_path, LINES)
    rs = build_requests(trace_spec(path), 0, VOCAB)
    assert [r.arrival_s for r in rs.measured] == [0, 1, 2, 4, 8, 16]
    fast = build_requests(trace_spec(path, time_scale=0.25), 0, VOCAB)
    assert [r.arrival_s for r in fast.measured] == [0, 0.25, 0.5, 1, 2, 4]
    assert rs.requested_rate == pytest.approx(5 / 16)
    assert fast.requested_rate == pytest.approx(4 * 5 / 16)


def test_window_keeps_start_inclusive_end_exclusive_and_restarts_the_clock(tmp_path):
    path = write(tmp_path, LINES)
    rs = build_requests(trace_spec(path, start_s=2, end_s=16), 0, VOCAB)
    assert [r.arrival_s for r in rs.measured] == [0, 2, 6]  # original 2, 4, 8
    capped = build_requests(trace_spec(path, start_s=1, max_requests=2, time_scale=2), 0, VOCAB)
    assert [r.arrival_s for r in capped.measured] == [0, 2]
    with pytest.raises(TraceError, match="no request between 20 s and end of trace"):
        build_requests(trace_spec(path, start_s=20), 0, VOCAB)


def test_milliseconds_and_unsorted_lines(tmp_path):
    path = write(tmp_path, [{"timestamp": 3000, "input_len": 3, "output_len": 1},
                            {"timestamp": 1000, "input_len": 1, "output_len": 1},
                            {"timestamp": 1000, "input_len": 2, "output_len": 1}])
    rs = build_requests(trace_spec(path, time_unit="ms"), 0, VOCAB)
    assert [r.arrival_s for r in rs.measured] == [0, 0, 2]
    assert [r.prompt_len for r in rs.measured] == [1, 2, 3]  # sorted by time; ties keep file order


def test_window_does_not_change_a_groups_prefix(tmp_path):
    lines = [{"timestamp": t, "input_len": 20, "output_len": 1, "prefix_group": g, "prefix_len": 8}
             for t, g in [(0, 1), (1, 2), (2, 1), (3, 2)]]
    path = write(tmp_path, lines)
    full = build_requests(trace_spec(path), 0, VOCAB).measured
    late = build_requests(trace_spec(path, start_s=2), 0, VOCAB).measured
    assert full[0].prompt_token_ids[:8] == full[2].prompt_token_ids[:8] == late[0].prompt_token_ids[:8]
    assert full[1].prompt_token_ids[:8] != full[0].prompt_token_ids[:8]
    assert full[0].prompt_token_ids[8:] != full[2].prompt_token_ids[8:]  # own parts differ


def test_text_prompts_are_sent_as_text_and_encoded_like_the_sim(tmp_path):
    from orchestrator.engines.sim.http_server import words_to_ids

    text = "Summarise t12 the following t34 document, please."
    path = write(tmp_path, [{"timestamp": 0, "prompt": text, "output_len": 7}])
    rs = build_requests(trace_spec(path, warmup=1), 0, VOCAB)
    r = rs.measured[0]
    assert r.prompt_text == text and r.output_len == 7
    assert list(r.prompt_token_ids) == words_to_ids(text, VOCAB) == list(text_token_ids(text, VOCAB))
    w = rs.warmup[0]
    assert w.prompt_text is None and w.prompt_len == r.prompt_len  # same shape, never the measured prompt
    assert text_token_ids(token_ids_to_text([11, 12, 13]), VOCAB) == (11, 12, 13)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("line, message", [
    ('{"timestamp": 0, "input_len": 5, "output_len": 3', "not valid JSON"),
    ('[1, 2]', "expected a JSON object"),
    ('{"timestamp": 0, "input_len": 5}', "output_len is missing"),
    ('{"input_len": 5, "output_len": 3}', "timestamp is missing"),
    ('{"timestamp": -1, "input_len": 5, "output_len": 3}', "timestamp must be a number >= 0"),
    ('{"timestamp": 0, "prompt": "hi", "input_len": 5, "output_len": 3}', "exactly one of prompt"),
    ('{"timestamp": 0, "input_len": 0, "output_len": 3}', "input_len must be an integer >= 1"),
    ('{"timestamp": 0, "input_len": 2.5, "output_len": 3}', "input_len must be an integer"),
    ('{"timestamp": 0, "input_len": 5, "output_len": 3, "ouput_len": 3}', "did you mean 'output_len'"),
    ('{"timestamp": 0, "input_len": 5, "output_len": 3, "prefix_len": 2}', "prefix_len needs a prefix_group"),
    ('{"timestamp": 0, "input_len": 5, "output_len": 3, "prefix_group": 1}', "needs a prefix_len"),
])
def test_a_malformed_line_names_the_file_and_line(tmp_path, line, message):
    good = json.dumps({"timestamp": 0, "input_len": 5, "output_len": 3})
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{good}\n\n{good}\n{line}\n{good}\n")
    with pytest.raises(TraceError) as e:
        build_requests(trace_spec(path), 0, VOCAB)
    assert str(e.value).startswith(f"{path}:4: "), str(e.value)
    assert message in str(e.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(TraceError, match="file not found .*shipped traces: .*chat"):
        build_requests(trace_spec(tmp_path / "nope.jsonl"), 0, VOCAB)
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(TraceError, match="no requests in the file"):
        read_trace(tmp_path / "empty.jsonl")


def test_validate_reports_a_bad_trace_line(tmp_path, study_doc, capsys):
    from orchestrator.cli import main

    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_len": 5, "output_len": 3}\n{"timestamp": 1}\n')
    study_doc["workload"] = {"trace": {"path": "t.jsonl"}}  # relative to the study file
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(study_doc))
    assert main(["validate", str(tmp_path / "s.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"workload.trace.path: {tmp_path / 't.jsonl'}:2: give exactly one of prompt" in err, err


def test_trace_excludes_synthetic_keys():
    with pytest.raises(ValueError, match="trace gives arrivals and lengths; remove arrival, input_len"):
        WorkloadSpec.model_validate({"trace": {"path": "chat"}, "arrival": {"kind": "poisson", "rate": 9},
                                     "input_len": 100})
    with pytest.raises(ValueError, match="end_s .* must be > start_s"):
        WorkloadSpec.model_validate({"trace": {"path": "chat", "start_s": 5, "end_s": 5}})
    # A dumped spec (every key present, as in study.json) still loads.
    spec = WorkloadSpec.model_validate({"trace": {"path": "chat"}})
    assert WorkloadSpec.model_validate_json(spec.model_dump_json()) == spec


def test_select_window_is_pure():
    from orchestrator.workload.trace import resolve_workload_file

    entries = read_trace(resolve_workload_file("summarisation"))
    chosen, due = select_window(entries, start_s=10, end_s=20, time_scale=0.5)
    rel = [e.timestamp - entries[0].timestamp for e in chosen]
    assert all(10 <= t < 20 for t in rel)
    assert np.allclose(due, (np.array(rel) - rel[0]) * 0.5)
