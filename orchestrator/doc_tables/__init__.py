"""The docs' generated tables, each registered with its dataset and checked against it
(:mod:`.registry`: ``python -m orchestrator.doc_tables.registry --check``). No command reaches them."""
