"""Allowed values of config fields, declared next to the fields and checked in one place.

Types and choices are checked by OmegaConf when Hydra composes a config (choice fields are
:class:`Choice` enums).  Ranges are declared on the schema's field::

    batch_size: int = checked(2048, ge=1)
    ratios: list[float] = checked(factory=lambda: [0.01], gt=0, le=1)   # every element

and :func:`validate`, which the dispatcher calls right after composition for every command, checks
every declared range of the composed config (OmegaConf does not run ``__post_init__``), so a bad
value stops the command with one line naming the key before anything is built.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

_RANGE = "dlrm_cache.range"  # the dataclass field metadata key


# The largest seed: what numpy's legacy seeding takes (2**32 - 1), and far enough inside torch's
# 64 bits for the seeds derived from it (a table's: seed * 1_000_003 + a 32-bit hash).
MAX_SEED = 2**32 - 1


class ConfigError(ValueError):
    """A config value out of its declared range; the message names the key."""


class Choice(str, Enum):
    """A choice field's values.  A ``str`` too, so code compares and formats it as its value; member
    names must equal their values (OmegaConf takes overrides by name).  A config saved as data
    (a checkpoint loaded with weights_only=True) must hold the plain values:
    ``OmegaConf.to_container(cfg, enum_to_str=True)``."""

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class Range:
    """What a value (or each element of a list value) must satisfy."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    also: tuple[Any, ...] = ()  # special values allowed outside the range, e.g. -1 for "all"
    pattern: str | None = None  # strings: a full match of this regex
    nonempty: bool = False  # lists: at least one element
    multiple_of: int | None = None  # integers: a multiple of this

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not allowed, or None."""
        if isinstance(value, (list, tuple, ListConfig)):
            if self.nonempty and len(value) == 0:
                return "must not be empty"
            for v in value:
                if (p := self.problem(v)) is not None:
                    return f"element {v!r} {p}"
            return None
        if value is None or value in self.also:
            return None
        if isinstance(value, float) and not math.isfinite(value):  # no range means inf or nan
            return "must be a finite number"
        if self.pattern is not None:
            return None if re.fullmatch(self.pattern, str(value)) else f"must match {self.pattern}"
        if self.multiple_of and isinstance(value, int) and value % self.multiple_of:
            return f"must be a multiple of {self.multiple_of}"
        bounds = self._bounds()
        if all(cmp(value, b) for _, cmp, b in bounds):
            return None
        return f"must be {self._need(bounds)}" + "".join(f" (or {a!r})" for a in self.also)

    def _bounds(self) -> list[tuple[str, Callable[[Any, Any], bool], float]]:
        return [
            (op, cmp, b)
            for op, cmp, b in (
                (">=", operator.ge, self.ge),
                (">", operator.gt, self.gt),
                ("<=", operator.le, self.le),
                ("<", operator.lt, self.lt),
            )
            if b is not None
        ]

    @staticmethod
    def _need(bounds: list[tuple[str, Callable[[Any, Any], bool], float]]) -> str:
        # an integer bound as all its digits (2**32 - 1 is not 4.29497e+09)
        return " and ".join(
            f"{op} {b if isinstance(b, int) else format(b, 'g')}" for op, _, b in bounds
        )

    def describe(self) -> str:
        """The range as help shows it (``>= 1 or -1``, ``each > 0 and <= 1, non-empty``)."""
        parts = []
        if self.pattern is not None:
            parts.append(f"matching {self.pattern}")
        if bounds := self._bounds():
            parts.append(self._need(bounds) + "".join(f" or {a!r}" for a in self.also))
        if self.multiple_of:
            parts.append(f"a multiple of {self.multiple_of}")
        if self.nonempty:
            parts.append("non-empty")
        return ", ".join(parts)


_ANY = Range()  # what a field without a declared range must satisfy (a finite number, if one)


def checked(
    default: Any = dataclasses.MISSING, *, factory: Callable[[], Any] | None = None, **range_: Any
) -> Any:
    """A dataclass field with a default (or a ``factory`` for lists) and a :class:`Range`."""
    meta = {_RANGE: Range(**range_)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def field_range(f: dataclasses.Field) -> str:
    """The declared range of a schema field, as help shows it ("" if none)."""
    rng: Range | None = f.metadata.get(_RANGE)
    return rng.describe() if rng is not None else ""


def validate(cfg: Any, prefix: str = "") -> None:
    """Raise :class:`ConfigError` for the first value outside its declared range.

    ``cfg``: a composed config, or a schema dataclass instance; nested schema nodes are walked.
    """
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        cfg = OmegaConf.structured(cfg)
    schema = OmegaConf.get_type(cfg)
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
        return
    for f in dataclasses.fields(schema):
        rng: Range | None = f.metadata.get(_RANGE)
        if OmegaConf.is_missing(cfg, f.name) or (
            rng is None and OmegaConf.is_interpolation(cfg, f.name)
        ):
            continue  # unset, or e.g. run_dir (resolved by Hydra's runtime): nothing to check
        value = cfg[f.name]
        p = _nested(f, value) or (rng or _ANY).problem(value)
        if p is not None:
            shown = OmegaConf.to_container(value) if isinstance(value, ListConfig) else value
            raise ConfigError(f"{prefix}{f.name}={shown}: {p}")
        if isinstance(value, DictConfig):
            validate(value, f"{prefix}{f.name}.")


def _is_schema(t: Any) -> bool:
    return isinstance(t, type) and dataclasses.is_dataclass(t)


def _nested(f: dataclasses.Field, value: Any) -> str | None:
    """Why a list of scalars (``list[int]``, ``list[str]``, ...) holds a list or mapping, or None:
    OmegaConf lets ``[[16]]`` through a ``list[int]`` field."""
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
    if not (isinstance(value, ListConfig) and str(kind).startswith("list[")) or "Any" in str(kind):
        return None
    for v in value:
        if isinstance(v, DictConfig) and _is_schema(OmegaConf.get_type(v)):
            continue  # a list of schema nodes (schema.dense's columns): validate() walks them
        if isinstance(v, (ListConfig, DictConfig)):
            return f"element {OmegaConf.to_container(v)!r} is not a single value"
    return None


def bool_overrides(cfg: DictConfig, overrides: list[str] | None = None) -> None:
    """Raise :class:`ConfigError` for a bool key given anything but true or false on the command
    line (``overrides``; None: this Hydra job's, a -m sweep's own values): OmegaConf takes ``yes``,
    ``on``, ``1`` (and their opposites) as bools, so ``progress=yes`` passed where a typo
    (``progress=ys``) would stop."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf.nodes import BooleanNode

    if overrides is None:
        overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    for o in OverridesParser.create().parse_overrides(overrides):
        value = None if o.is_delete() else o.value()
        if value is None or isinstance(value, bool) or str(value).startswith("${"):
            continue
        parent, _, name = o.key_or_group.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if isinstance(node, DictConfig) and isinstance(node._get_node(name), BooleanNode):
            raise ConfigError(f"{o.input_line}: {o.key_or_group} is true or false")
