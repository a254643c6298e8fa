"""Fuzzing the trace loader: a bad trace line is one error naming the file and line, exit code 2.

Traces reach users through a study's ``workload.trace`` (``orchestrator/workload/trace.py``),
so each fuzzed file is checked both by ``read_trace`` and by ``orchestrator validate``.
"""

from __future__ import annotations

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.workload import trace
from support.fuzz_studies import LINE, study_with_trace

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(LINE, min_size=0, max_size=6))
def test_fuzzed_traces_load_or_name_the_line(tmp_path, capsys, lines):
    from orchestrator.cli import main

    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    try:
        entries = trace.read_trace(path)
    except trace.TraceError as e:
        msg = str(e)
        assert "\n" not in msg and msg.startswith(str(path))
        entries = None
    else:
        assert entries
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump(study_with_trace(path.name)))
    rc = main(["validate", str(study)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    if rc == 0:
        assert entries is not None and out.startswith(f"{study}: OK")
    else:
        assert rc == 2 and out == ""
        (line,) = err.splitlines()
        assert line.startswith(f"{study}: workload.trace") and str(path) in line


def test_bad_line_is_named(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_len": 10, "output_len": 5}\n{"timestamp": 1, "input_len": -3, '
                    '"output_len": 5}\n')
    with pytest.raises(trace.TraceError) as info:
        trace.read_trace(path)
    assert str(info.value).startswith(f"{path}:2:") and "input_len" in str(info.value)
