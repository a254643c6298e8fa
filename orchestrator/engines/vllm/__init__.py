"""Real vLLM as an engine: one Serve application per trial (:mod:`.serve`, its replica
:mod:`.deployment`), ``vllm serve`` under a supervisor that owns its process group (:mod:`.process`),
and the server's log read back into the failure classifier (:mod:`.logs`)."""
