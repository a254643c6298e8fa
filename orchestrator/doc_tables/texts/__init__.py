"""The docs' generated texts: the prose beside the generated tables, each sentence's figures (and the
claims made of them) computed from its dataset (:mod:`orchestrator.doc_tables.blocks`). No command
reaches them; :mod:`orchestrator.doc_tables.registry` registers and checks them."""
