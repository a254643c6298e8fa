"""The base of every section of a study file: strict on input, immutable once read."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    # Unknown keys are errors (a typo is reported, never ignored); .inf and .nan are lost in a
    # JSON round trip of the study and mean no setting here.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
