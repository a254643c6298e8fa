"""The Python examples of a Markdown page, run as a user pastes them (docs/querying.md)."""

from __future__ import annotations

import re


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", markdown, flags=re.S | re.M)


# Runs each block in a fresh namespace of one interpreter (imports are paid once), as a user would paste it:
# ``python -c BLOCK_RUNNER BLOCK...``; prints ``=== block N`` before each, exits 1 at the first that fails.
BLOCK_RUNNER = """
import sys, traceback
blocks = sys.argv[1:]
for i, code in enumerate(blocks, 1):
    print(f"=== block {i}", flush=True)
    try:
        exec(compile(code, f"docs/querying.md block {i}", "exec"), {"__name__": "__main__"})
    except BaseException:
        traceback.print_exc()
        print(f"=== block {i} failed", flush=True)
        sys.exit(1)
"""
