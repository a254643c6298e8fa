"""The Python examples of a Markdown page, run as a user pastes them (docs/querying.md)."""

from __future__ import annotations

import pickle
import re
from collections import defaultdict
from pathlib import Path


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", markdown, flags=re.S | re.M)


# Runs each block in a fresh namespace of one interpreter (imports are paid once), as a user would paste it:
# ``python -c BLOCK_RUNNER BLOCK...``; prints ``=== block N`` before each, exits 1 at the first that fails.
# With ``DOC_BLOCKS_PRINTED=FILE`` in its environment it also keeps what each ``print`` of a block was given
# (the objects, pickled; their repr where one cannot be), so that a test compares the values, not the text.
BLOCK_RUNNER = """
import builtins, os, pickle, sys, traceback
blocks = sys.argv[1:]
printed = []

def _kept(value):
    try:
        pickle.dumps(value)
        return value
    except Exception:
        return repr(value)

def recording_print(*args, **kwargs):
    printed.append((block, tuple(_kept(a) for a in args)))
    builtins.print(*args, **kwargs)

for block, code in enumerate(blocks, 1):
    print(f"=== block {block}", flush=True)
    try:
        exec(compile(code, f"docs/querying.md block {block}", "exec"), {"__name__": "__main__", "print": recording_print})
    except BaseException:
        traceback.print_exc()
        print(f"=== block {block} failed", flush=True)
        sys.exit(1)
if os.environ.get("DOC_BLOCKS_PRINTED"):
    with open(os.environ["DOC_BLOCKS_PRINTED"], "wb") as f:
        pickle.dump(printed, f)
"""


def printed_values(path: Path) -> dict[int, list[tuple]]:
    """What :data:`BLOCK_RUNNER` kept: per block (1-based), the arguments of each of its ``print`` calls."""
    out: dict[int, list[tuple]] = defaultdict(list)
    for block, args in pickle.loads(path.read_bytes()):
        out[block].append(args)
    return dict(out)
