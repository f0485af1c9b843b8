"""Config values are checked before a command builds anything: choices at composition (Enums in
the schemas), ranges by the one validate() the dispatcher runs right after it."""

from __future__ import annotations

import dataclasses
import itertools
import re
import subprocess
import typing
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from launching import run_cli
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

import dlrm_cache.config.schemas as schemas
import dlrm_cache.data.config as data_schemas
from dlrm_cache.commands.store import config_dir, register_configs
from dlrm_cache.config.ranges import ConfigError, Range, validate

CONFIGS = Path(config_dir())


def _compose(command: str, overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name=command, overrides=overrides)


def _schemas() -> list[type]:
    return [
        c
        for m in (schemas, data_schemas)
        for c in vars(m).values()
        if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == m.__name__
    ]


def test_every_numeric_field_declares_its_range() -> None:
    """A numeric field (or list of numbers) without a declared range is a value nobody checks."""
    unchecked = []
    for schema in _schemas():
        hints = typing.get_type_hints(schema)
        for f in dataclasses.fields(schema):
            t = hints[f.name]
            numeric = t in (int, float) or typing.get_args(t) in ((int,), (float,))
            if numeric and not any(isinstance(v, Range) for v in f.metadata.values()):
                unchecked.append(f"{schema.__name__}.{f.name}")
    assert unchecked == []


GROUPS = ("data", "model", "embedding", "optim")
# pairs of groups one of whose configs interpolates the other's keys (embedding/freq_cache.yaml:
# batch_size: ${data.batch_size}): their options are composed in every combination
LINKED = {("embedding", "data")}


def _shipped(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def _linked_sets() -> list[tuple[str, ...]]:
    """The groups as sets that are independent of each other: each a group, or groups LINKED."""
    sets = [{g} for g in GROUPS]
    for a, b in LINKED:
        (sa,) = [s for s in sets if a in s]
        (sb,) = [s for s in sets if b in s]
        if sa is not sb:
            sets.remove(sb)
            sa |= sb
    return [tuple(g for g in GROUPS if g in s) for s in sets]


def test_the_groups_outside_linked_pairs_are_independent() -> None:
    """What lets the next test compose 20 combinations instead of all 180: a group's config names
    no other group (its defaults list holds its schema, _self_ or another option of its group; no
    ``@package``) and interpolates only groups LINKED with it, so a value it sets is the same
    whatever the others choose, and in range in every combination if it is in range in one."""
    for g in GROUPS:
        for path in (CONFIGS / g).glob("*.yaml"):
            text = path.read_text()
            assert "@package" not in text, path
            defaults = OmegaConf.load(path).get("defaults", [])
            own = {"_self_", *_shipped(g)}  # an option may start from another of its group's
            assert all(d in own or d.endswith("_schema@_here_") for d in defaults), path
            for expression in re.findall(r"\$\{([^}]*)\}", text):
                # a relative interpolation (${..x}) may climb into another group's keys
                assert not expression.lstrip().startswith("."), (path, expression)
                for other in re.findall(r"(?<![\w.])(\w+)\.", expression):  # also in resolvers
                    linked = (g, other) in LINKED or (other, g) in LINKED
                    assert other == g or other not in GROUPS or linked, (path, expression)


@pytest.mark.parametrize("groups", _linked_sets(), ids="+".join)
def test_every_shipped_config_is_in_range(groups: tuple[str, ...]) -> None:
    """Every combination of the options of ``groups`` (the others at train's defaults; a model
    without ``optim=`` takes its own optimizer preset): with the test above, every combination
    of the shipped configs."""
    for combo in itertools.product(*(_shipped(g) for g in groups)):
        validate(_compose("train", [f"{g}={c}" for g, c in zip(groups, combo)]))


@pytest.mark.parametrize("command", ["synth", "preprocess", "plan", "bench"])
def test_every_other_commands_config_is_in_range(command: str) -> None:
    validate(_compose(command, []))


@pytest.mark.parametrize(
    "command,override,message",
    [
        ("train", "data.batch_size=0", "data.batch_size=0: must be >= 1"),
        ("train", "data.batch_size=-8", "data.batch_size=-8: must be >= 1"),
        ("train", "data.eval_batch_size=0", "data.eval_batch_size=0: must be >= 1"),
        ("train", "log_every=0", "log_every=0: must be >= 1"),
        ("train", "model.embedding_dim=0", "model.embedding_dim=0: must be >= 1"),
        ("train", "model.top_mlp=[64,-1]", "model.top_mlp=[64, -1]: element -1 must be >= 1"),
        ("train", "checkpoint_every=-5", "checkpoint_every=-5: must be >= 0"),
        ("train", "epochs=0", "epochs=0: must be >= 1"),
        ("train", "max_steps=0", "max_steps=0: must be >= 1 (or -1)"),
        ("train", "eval_batches=-2", "eval_batches=-2: must be >= 1 (or -1)"),
        ("train", "device=gpu", "device=gpu: must match"),
        ("train", "optim.sparse.lr=-0.1", "optim.sparse.lr=-0.1: must be >= 0"),
        ("train", "dist_timeout_s=0", "dist_timeout_s=0.0: must be > 0"),
        (
            "train",
            "embedding=freq_cache embedding.cache_ratio=0",
            "embedding.cache_ratio=0.0: must be > 0 and <= 1",
        ),
        (
            "train",
            "embedding=freq_cache embedding.static_fraction=1.5",
            "embedding.static_fraction=1.5: must be >= 0 and <= 1",
        ),
        (
            "train",
            "embedding=uvm_cache embedding.cache_ratio=2",
            "embedding.cache_ratio=2.0: must be > 0 and <= 1",
        ),
        # issue 38 target 7: before, "Overflow when unpacking long long" after the build started
        (
            "train",
            "seed=9223372036854775807",
            "seed=9223372036854775807: must be >= 0 and <= 4294967295",
        ),
        (
            "preprocess",
            "multi_hot_seed=4294967296",
            "multi_hot_seed=4294967296: must be >= 0 and <= 4294967295",
        ),
        ("synth", "lines=0", "lines=0: must be >= 1"),
        ("synth", "missing_rate=1.5", "missing_rate=1.5: must be >= 0 and <= 1"),
        ("synth", "positive_rate=1", "positive_rate=1.0: must be > 0 and < 1"),
        ("preprocess", "rows_per_shard=0", "rows_per_shard=0: must be >= 1"),
        ("preprocess", "train_fraction=0", "train_fraction=0.0: must be > 0 and <= 1"),
        ("preprocess", "chunk_bytes=0", "chunk_bytes=0: must be >= 1"),
        ("plan", "ratios=[]", "ratios=[]: must not be empty"),
        ("plan", "ratios=[0.1,2]", "ratios=[0.1, 2.0]: element 2.0 must be > 0 and <= 1"),
        ("bench", "iters=0", "iters=0: must be >= 1"),
        ("bench", "cache_ratios=[0]", "cache_ratios=[0.0]: element 0.0 must be > 0 and <= 1"),
        # before: torchrec's "OverArch must have multiple layers." (no key), and a TypeError
        # traceback from the model's shape check for a nested list OmegaConf lets through list[int]
        ("train", "model.top_mlp=[]", "model.top_mlp=[]: must not be empty"),
        ("bench", "top_mlp=[]", "top_mlp=[]: must not be empty"),
        ("train", "model.bottom_mlp=[[16]]", "model.bottom_mlp=[[16]]: element [16] is not a"),
        ("plan", "ratios=[0.1,[0.2]]", "ratios=[0.1, [0.2]]: element [0.2] is not a single"),
    ],
)
def test_out_of_range_value_names_its_key(command: str, override: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        validate(_compose(command, override.split()))
    assert str(e.value).startswith(message)


@pytest.mark.parametrize(
    "command,override",
    [
        ("train", "optim.dense.name=bogus"),
        ("train", "optim.sparse.name=adam"),
        ("train", "embedding=freq_cache embedding.policy=mru"),
        ("train", "embedding=uvm_cache embedding.algorithm=fifo"),
        ("preprocess", "split=week"),
        ("preprocess", "bad_lines=ignore"),
        ("bench", "kind=everything"),
        ("bench", "backends=[host,gpu]"),
        ("bench", "uvm_algorithms=[lru,fifo]"),
    ],
)
def test_unknown_choice_fails_at_composition(command: str, override: str) -> None:
    with pytest.raises((ConfigCompositionException, ValidationError)) as e:
        _compose(command, override.split())
    key = override.split()[-1].split("=")[0]
    assert key in str(e.value) + str(e.value.__cause__)


def test_choices_read_as_their_values() -> None:
    cfg = _compose(
        "train", ["optim.dense.name=adam", "embedding=freq_cache", "embedding.policy=lru"]
    )
    assert cfg.optim.dense.name == "adam" and f"{cfg.embedding.policy}" == "lru"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_cli(*args, cwd=cwd, timeout=120, plain_errors=True)


def test_cli_checks_ranges_before_anything_else(tmp_path: Path) -> None:
    """One line naming the key, exit 1, before the command looks at its data (the data path does
    not even exist) or builds anything."""
    res = _cli("train", "data.path=/nonexistent", "checkpoint_every=-5", cwd=tmp_path)
    assert res.returncode == 1
    assert res.stderr.strip() == "dlrm-cache train: error: checkpoint_every=-5: must be >= 0"
    res = _cli(
        "preprocess", "input=/nonexistent", f"output={tmp_path / 'ds'}", "min_count=0", cwd=tmp_path
    )
    assert res.returncode == 1
    assert res.stderr.strip() == "dlrm-cache preprocess: error: min_count=0: must be >= 1"
    assert not (tmp_path / "ds").exists()


def test_range_messages() -> None:
    assert Range(ge=1).problem(0) == "must be >= 1"
    assert Range(ge=1).problem(1) is None
    assert (
        Range(gt=0, le=1).problem(1.0) is None
        and Range(gt=0, le=1).problem(0.0) == "must be > 0 and <= 1"
    )
    assert Range(ge=1, also=(-1,)).problem(-1) is None
    assert Range(ge=1, nonempty=True).problem([]) == "must not be empty"
    assert Range(pattern=r"cpu|cuda(:\d+)?").problem("cuda:1") is None
