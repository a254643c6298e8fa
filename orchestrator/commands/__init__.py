"""The sub-commands of the ``orchestrator`` command line (one module per group)."""
