"""The study file's ``analysis`` section: how results are turned into decisions.

Nothing here changes a measurement (it is not part of a study's fingerprint): it says when two
configurations are the same for the user's purpose (:mod:`orchestrator.results.paired`).
"""

from __future__ import annotations

from pydantic import Field

from orchestrator.strict_model import StrictModel

__all__ = ["AnalysisSettings"]


class AnalysisSettings(StrictModel):
    equivalence_margin: float = Field(
        default=0.05, ge=0, lt=1,
        description="two configurations are equivalent on a metric when the interval of their paired "
                    "difference lies within +-this share; `recommend` then picks among them by its rule "
                    "(fewer GPUs, less memory, closer to vLLM's defaults)")
