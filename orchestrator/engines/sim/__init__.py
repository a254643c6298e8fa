"""The simulated engine as an engine: served by Ray Serve in real time (:mod:`.served`, its replica
:mod:`.ingress`, the OpenAI-compatible front end :mod:`.http_server` over the engine thread
:mod:`.loop`), or run in virtual time (:mod:`.virtual`). The simulator itself is :mod:`orchestrator.sim`."""
