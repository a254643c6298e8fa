"""What counts as a measured number: the one reading of "a finite number, or None"."""

from __future__ import annotations

import math
from typing import Any, Optional


def finite_float(value: Any) -> Optional[float]:
    """``value`` as a float when it is a finite number; None when it is missing, NaN, infinite, a
    bool or text (a damaged row's or file's value is never read as a measurement)."""
    if value is None or isinstance(value, (bool, str, bytes)):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None
