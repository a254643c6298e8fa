"""No credential in any log or error line, nor in anything the project writes.

Credentials are planted three ways: an ``hf_token_env`` reference (the engine gets the token on
its command line), a URL's userinfo and a URL fragment parameter under environment variable
names the redactor does not know. Each is followed to where the product writes text: the
server's log line and failure messages, ``study.json``, the trials Parquet, what Tune pickles,
``recommend``'s output.
"""

from __future__ import annotations

import json
import pickle
from datetime import datetime, timezone

import pytest

from orchestrator.redaction import REDACTED, scrub

TOKEN = "hf_planted_token_4e1c9a"  # by reference: engine_kwargs.hf_token_env
PROXY_PW = "planted-proxy-pw-77b2"  # http://user:PW@proxy under HTTPS_PROXY
FRAGMENT = "planted-fragment-5d0e"  # https://h/#access_token=X under DOWNLOAD_URL
PLANTED = (TOKEN, PROXY_PW, FRAGMENT)


def vllm_study(tmp_path):
    from orchestrator.study.spec import parse_study

    return parse_study({
        "name": "secrets", "model": {"name": "tiny-llama"}, "hardware": {"gpu": "CPU"},
        "engine": {"kind": "vllm", "platform": "cpu", "load_format": "dummy",
                   "engine_kwargs": {"hf_token_env": "ORCH_TEST_HF_TOKEN"},
                   "env": {"HTTPS_PROXY": f"http://user:{PROXY_PW}@proxy:3128",
                           "DOWNLOAD_URL": f"https://models.example/m#access_token={FRAGMENT}&x=1"}},
        "space": {"max_num_seqs": [2, 4]}, "objectives": ["maximize output_throughput"],
        "output": str(tmp_path / "out"),
    })


def test_the_vllm_server_log_line_and_its_failure_messages_hold_no_token(tmp_path, monkeypatch):
    """The command the replica writes at the top of its log (in Ray's session folder), and the
    failure messages Serve copies into its own logs, built as ``VllmServer`` builds them."""
    from orchestrator.engines.vllm.process import command_secrets, failure_text, log_command, server_command
    from orchestrator.engines.vllm.serve import VllmServeEngine
    from orchestrator.hardware.engine_args import engine_args_from_params
    from orchestrator.search.trial_plan import engine_target

    monkeypatch.setenv("ORCH_TEST_HF_TOKEN", TOKEN)
    study = vllm_study(tmp_path)
    engine = VllmServeEngine(engine_target(study))
    args = engine.resolve(engine_args_from_params({"max_num_seqs": 4}, fixed=dict(study.engine.engine_kwargs)))
    env = engine.engine_env(args)
    cmd = server_command(8123, engine.server_argv("t1", args, str(tmp_path / "model")))
    assert cmd[cmd.index("--hf-token") + 1] == TOKEN  # the server itself gets it
    secrets = command_secrets(cmd, env)

    log = tmp_path / "vllm_server-t1.log"
    with open(log, "ab") as f:
        log_command(f, cmd, secrets)
        # The server quoting them back, as a failing download or proxy may.
        f.write(f"401 for token {TOKEN} through {env['HTTPS_PROXY']}\n".encode())
    head = log.read_text().splitlines()[0]
    assert TOKEN not in head and "--hf-token '***'" in head and "--max-num-seqs 4" in head, head
    message = failure_text("vllm serve exited with code 1 while starting:\n", log, secrets)
    assert "--hf-token '***'" in message and "401 for token ***" in message
    assert not [s for s in PLANTED if s in message], message


def test_credentials_under_unknown_names_are_never_written(tmp_path, monkeypatch, capsys):
    """study.json, the trials Parquet (a failure message quoting them too), what Tune pickles and
    ``recommend``'s output hold neither the proxy password nor the fragment's token."""
    from orchestrator.cli import main
    from orchestrator.failures import Failure, FailureKind, TrialStatus
    from orchestrator.hardware.engine_args import EngineArgs
    from orchestrator.results import ResultsStore
    from orchestrator.results.definition import write_study_definition
    from orchestrator.search.row import trial_row
    from orchestrator.trial.result import TrialResult

    monkeypatch.setenv("ORCH_TEST_HF_TOKEN", TOKEN)
    study = vllm_study(tmp_path)
    write_study_definition(study)
    now = datetime.now(timezone.utc)
    quoted = " ".join(study.engine.env.values())
    result = TrialResult(run_id="r1", trial_id="secrets-t1", trial_number=0, params={"max_num_seqs": 4},
                         args=EngineArgs(max_num_seqs=4, extra={"hf_token_env": "ORCH_TEST_HF_TOKEN"}),
                         started_at=now, finished_at=now, status=TrialStatus.COMPLETED,
                         failure=Failure(FailureKind.TEARDOWN_LEAK, f"proxy refused {quoted}; token {TOKEN}"))
    row = trial_row(study, result)
    ResultsStore(study.output, study.name).write_trial(row, param_types=study.space.column_types())
    assert "proxy refused http://***@proxy:3128 https://models.example/m#access_token=***&x=1" in row["failure_message"]

    assert main(["recommend", str(tmp_path / "out" / "secrets"), "--trial", "secrets-t1"]) == 0
    printed = capsys.readouterr().out
    assert 'HTTPS_PROXY="${HTTPS_PROXY}"' in printed and '--hf-token "${ORCH_TEST_HF_TOKEN}"' in printed
    assert "http://***@proxy:3128" in printed  # the serve config's env_vars: redacted, not dropped

    written = {str(p): p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()}
    assert any(p.endswith("study.json") for p in written) and any(p.endswith(".parquet") for p in written)
    pickled = pickle.dumps(study.without_secrets())  # what the searcher and Tune's callbacks hold
    for secret in PLANTED:
        assert secret not in printed
        assert secret.encode() not in pickled
        assert not [p for p, data in written.items() if secret.encode() in data], secret
        assert not [v for v in row.values() if isinstance(v, str) and secret in v], secret
    stored = json.loads((tmp_path / "out" / "secrets" / "study.json").read_text())["study"]["engine"]["env"]
    assert stored == {"HTTPS_PROXY": "http://***@proxy:3128",
                      "DOWNLOAD_URL": "https://models.example/m#access_token=***&x=1"}


@pytest.mark.parametrize("text, shown", [
    ("http://user:pw-123@proxy:3128", "http://***@proxy:3128"),
    ("clone https://ghp_tok3n@github.com/o/r.git failed", "clone https://***@github.com/o/r.git failed"),
    ("https://h:8000/#access_token=abcd&token_type=bearer", "https://h:8000/#access_token=***&token_type=bearer"),
    ("https://h/app#/cb?id_token=abcd", "https://h/app#/cb?id_token=***"),
    ("https://b.s3.example/o?X-Amz-Credential=a1&X-Amz-Signature=f00d&v=2",
     "https://b.s3.example/o?X-Amz-Credential=***&X-Amz-Signature=***&v=2"),
    ("https://h/?api%5Fkey=abcd&page=2", "https://h/?api%5Fkey=***&page=2"),
    ("HF_TOKEN=hf_abcd vllm serve m --api-key=sk-1234", "HF_TOKEN=*** vllm serve m --api-key=***"),
    ("input_value={'hf_token': 'hf_abcd', 'max_num_seqs': 4}", "input_value={'hf_token': '***', 'max_num_seqs': 4}"),
    # Counts of tokens and variable names are not credentials.
    ("max_num_batched_tokens=512 long_prefill_token_threshold=3", None),
    ('{"hf_token_env": "HF_TOKEN", "url": "https://h:8000/v1?api-version=2024"}', None),
])
def test_the_text_redactor_hides_credentials_whatever_their_name(text, shown):
    assert scrub(text) == (text if shown is None else shown)
    assert scrub(scrub(text)) == scrub(text)  # redacting twice changes nothing


def test_known_secret_values_are_hidden_wherever_they_appear():
    shown = scrub("engine said: bad token hf_xyz987 (hf_xyz987)", {"hf_xyz987"})
    assert shown == f"engine said: bad token {REDACTED} ({REDACTED})"


# Credential-shaped values in the wrong place of a study file: refused, and never echoed back.
SHAPED = ("hf_AbCdEfGhIjKlMnOpQrStUv12", "sk-proj-AbCdEfGhIjKlMnOpQrSt", "ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123",
          "AKIAABCDEFGHIJKLMNOP")


@pytest.mark.parametrize("section", [
    lambda t: {"engine": f"vllm --hf-token {t}"},                              # a string where a mapping goes
    lambda t: {"engine": {"kind": "vllm", "load_format": t}},                  # a bad value of a known key
    lambda t: {"space": {"max_num_seqs": [t, 4]}},                             # inside a list
    lambda t: {"workload": {"arrival": {"kind": "poisson", "rate": t}}},       # a number expected
    lambda t: {"model": {"name": ["tiny-llama", {"token": t}]}},               # a malformed section
    lambda t: {"objectives": [f"maximize {t}"]},                               # inside an objective's text
    lambda t: {"hardware": {"gpu": f"H100 --api-key {t}"}},
])
def test_no_refusal_echoes_a_credential_shaped_value(section, study_doc, tmp_path):
    import yaml

    from orchestrator.study.load import load_study
    from orchestrator.study.spec import StudyFileError

    for token in SHAPED:
        doc = {**study_doc, **section(token), "output": str(tmp_path / "out")}
        path = tmp_path / "study.yaml"
        path.write_text(yaml.safe_dump(doc))
        with pytest.raises(StudyFileError) as e:
            load_study(path)
        assert token not in str(e.value) and token[:12] not in str(e.value), str(e.value)
