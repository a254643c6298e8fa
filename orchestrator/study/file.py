"""Reading a study file: YAML, with every key given once.

YAML keeps the last of two equal keys in one mapping; in a study file that silently drops
a setting, so :func:`read_study_document` reports it as a problem instead (with both lines).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from orchestrator.study.errors import Problem, StudyFileError


class _DuplicateKeys(yaml.YAMLError):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("; ".join(map(str, problems)))


# Bounds a study file is held to before anything reads it: a few hundred bytes of nested YAML anchors
# expand to billions of items (an "alias bomb"), and validation would walk every one of them.
MAX_FILE_BYTES = 1 << 20  # 1 MiB: a study file is a page of settings; traces and datasets are files of their own
MAX_NODES = 100_000  # scalars, sequences and mappings once aliases are expanded
MAX_DEPTH = 64


class _TooLarge(yaml.YAMLError):
    pass


def _expanded_size(node, sizes: dict[int, int], depth: int = 0) -> int:
    """How many nodes ``node`` stands for once every alias is expanded (capped just past :data:`MAX_NODES`);
    RecursionError past :data:`MAX_DEPTH` levels."""
    if depth > MAX_DEPTH:
        raise RecursionError
    got = sizes.get(id(node))
    if got is not None:
        return got
    total = 1
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    else:
        children = []
    for child in children:
        total += _expanded_size(child, sizes, depth + 1)
        if total > MAX_NODES:
            raise _TooLarge(f"more than {MAX_NODES:,} values once its anchors and aliases are expanded")
    sizes[id(node)] = total
    return total


def _bracket_depth(text: str) -> int:
    """The deepest nesting of flow brackets in ``text`` (quotes not parsed: an over-estimate at worst)."""
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(depth - 1, 0)
    return deepest


class _StudyLoader(yaml.SafeLoader):
    """``yaml.safe_load``, except that a key given twice in one mapping is an error (YAML keeps the last),
    and a document that expands past :data:`MAX_NODES` values or :data:`MAX_DEPTH` levels is refused."""

    def construct_document(self, node):
        _expanded_size(node, {})
        problems: list[Problem] = []
        self._check_keys(node, [], problems, set())
        if problems:
            raise _DuplicateKeys(problems)
        return super().construct_document(node)

    def _check_keys(self, node, path: list[str], problems: list[Problem], seen: set[int]) -> None:
        if id(node) in seen:  # an alias of a node already walked (or a recursive anchor)
            return
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._check_keys(item, path + [str(i)], problems, seen)
        elif isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # merged entries may be overridden
                    self._check_keys(value_node, path, problems, seen)
                    continue
                if not isinstance(key_node, yaml.ScalarNode):
                    continue
                try:
                    key = self.construct_object(key_node)
                    hash(key)
                except Exception:  # noqa: BLE001 - an unusual key: compare its text
                    key = (key_node.tag, key_node.value)
                line = key_node.start_mark.line + 1
                key_path = ".".join(path + [str(key)])
                if key in first:
                    problems.append(Problem(key_path, f"duplicate key on line {line} (first on line {first[key]}); "
                                                      "YAML would keep only the last, so give each key once"))
                else:
                    first[key] = line
                self._check_keys(value_node, path + [str(key)], problems, seen)


def read_study_document(path: str | Path) -> Any:
    """The parsed YAML document at ``path``; :class:`StudyFileError` if it is missing or not valid YAML."""
    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise StudyFileError(source, [Problem("", "file not found")])
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise StudyFileError(source, [Problem("", f"the file is {size:,} bytes, more than a study file may be "
                                                  f"({MAX_FILE_BYTES:,}); traces and datasets go in files of "
                                                  "their own (workload.trace, workload.dataset)")])
    try:
        text = path.read_text()
        if _bracket_depth(text) > MAX_DEPTH:  # before the parser recurses through it
            raise RecursionError
        return yaml.load(text, Loader=_StudyLoader)  # noqa: S506 - a SafeLoader
    except _DuplicateKeys as e:
        raise StudyFileError(source, e.problems) from None
    except _TooLarge as e:
        raise StudyFileError(source, [Problem("", f"the document is too large to read: {e}")]) from None
    except RecursionError:
        raise StudyFileError(source, [Problem("", f"the document is too deeply nested to read (a study file "
                                                  f"needs a few levels; at most {MAX_DEPTH})")]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise StudyFileError(source, [Problem("", f"{where}not valid YAML: {getattr(e, 'problem', e)}")]) from None
    except UnicodeDecodeError:
        raise StudyFileError(source, [Problem("", "not a text file")]) from None
