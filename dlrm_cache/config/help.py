"""`dlrm-cache <command> --help`: the command's keys, read from its schema.

Every fact comes from where it is declared once: a key's type from the schema dataclass's
annotation, its allowed range from its :func:`~.ranges.checked` metadata (or its choice enum), its
meaning from the comment beside or above the field in the schema's source, and its default from
the composed config (the YAML files and the overrides given before ``--help`` included).  This
module formats; the dispatcher composes.  A field without a comment is a bug that
tests/test_cli_help.py reports.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import textwrap
import tokenize
import types
import typing
from enum import Enum
from typing import Any, NamedTuple

from omegaconf import DictConfig, ListConfig, OmegaConf

from .ranges import field_range


class KeyHelp(NamedTuple):
    key: str  # dotted, as an override spells it
    kind: str  # int, float, list[int], freq|lfu|lru, ...
    default: str  # the composed value, as an override would write it
    allowed: str  # the declared range ("" if none)
    meaning: str  # the schema's comment, on one line


@functools.cache
def field_meanings(schema: type) -> dict[str, str]:
    """Field name -> its comment in the source of ``schema`` (and of its base classes): the comment
    lines directly above the field, then the comments on the field's own lines, joined."""
    out: dict[str, str] = {}
    for cls in reversed(schema.__mro__):
        if dataclasses.is_dataclass(cls):
            out.update(_own_meanings(cls))
    return out


def _own_meanings(cls: type) -> dict[str, str]:
    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (a frozen build): no meanings
        return {}
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = src.splitlines()
    body = ast.parse(src).body[0]
    assert isinstance(body, ast.ClassDef)
    out = {}
    for stmt in body.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        above: list[str] = []
        n = stmt.lineno - 1
        while n >= 1 and lines[n - 1].strip().startswith("#"):
            above.insert(0, comments[n])
            n -= 1
        end = stmt.end_lineno or stmt.lineno
        own = [comments[i] for i in range(stmt.lineno, end + 1) if i in comments]
        out[stmt.target.id] = " ".join(above + own)
    return out


def _kind(tp: Any) -> str:
    """A field's type as help shows it."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return " | ".join(_kind(a) for a in inner) + (" | null" if len(inner) < len(args) else "")
    if origin in (list, tuple):
        return f"list[{_kind(args[0])}]" if args else "list"
    if origin is dict:
        return "dict"
    if isinstance(tp, type) and issubclass(tp, Enum):
        return "|".join(str(m.value) for m in tp)
    return getattr(tp, "__name__", str(tp))


def _shown(value: Any) -> str:
    """A composed value as an override writes it."""
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=False, enum_to_str=True)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, list):
        return "[" + ",".join(_shown(v) for v in value) + "]"
    return str(value)


def keys(cfg: DictConfig, prefix: str = "") -> list[KeyHelp]:
    """Every user-settable key of the composed ``cfg`` (schema order, nested nodes in place)."""
    schema = OmegaConf.get_type(cfg)
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
        return []
    hints = typing.get_type_hints(schema)
    meanings = field_meanings(schema)
    out: list[KeyHelp] = []
    for f in dataclasses.fields(schema):
        node = cfg._get_node(f.name)
        if f.name.startswith("_") or node is None:
            continue  # _target_: the placement's class, chosen by the group option
        if isinstance(node, DictConfig) and not node._is_missing() and not node._is_none():
            out += keys(node, f"{prefix}{f.name}.")
            continue
        raw = node._value()
        default = "(required)" if raw == "???" else _shown(raw)
        out.append(
            KeyHelp(
                f"{prefix}{f.name}",
                _kind(hints[f.name]),
                default,
                field_range(f),
                meanings.get(f.name, ""),
            )
        )
    return out


def format_help(
    command: str,
    summary: str,
    cfg: DictConfig,
    groups: dict[str, tuple[str, list[str]]],
    positional: str = "",
) -> str:
    """The help text of ``command``: its summary, usage (``positional``: the words before the
    overrides), groups (name -> (chosen, options)) and keys."""
    lines = [
        f"dlrm-cache {command}: {summary}",
        "",
        f"usage: dlrm-cache {command} {positional}[KEY=VALUE ...]"
        + (" [GROUP=OPTION ...]" if groups else ""),
        "       (`--cfg job` prints the composed config; `-m` sweeps comma-separated values)",
    ]
    if groups:
        lines += [
            "",
            "groups (GROUP=OPTION; the keys below are those of the options chosen: add",
            f"GROUP=OPTION before --help for another's, e.g. `dlrm-cache {command} "
            f"{next(iter(groups))}={groups[next(iter(groups))][1][0]} --help`):",
        ]
        width = max(map(len, groups))
        for name, (chosen, options) in groups.items():
            listed = ", ".join(f"{o} (chosen)" if o == chosen else o for o in options)
            lines.append(f"  {name:<{width}}  {listed}")
    lines += ["", "keys (KEY=VALUE; shown with the value this command would run with):"]
    for k in keys(cfg):
        what = ", ".join(x for x in (k.kind, k.allowed) if x)
        lines.append(f"  {k.key}={k.default}  ({what})")
        if k.meaning:
            lines += textwrap.wrap(
                k.meaning, width=100, initial_indent=" " * 6, subsequent_indent=" " * 6
            )
    return "\n".join(lines)
