"""Config defaults have one home, the schemas (dlrm_cache/config/schemas.py, dlrm_cache/data/config.py):
a YAML file under configs/ sets only what a schema cannot say (see schemas.py's docstring)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from dlrm_cache.cli import main
from dlrm_cache.commands.store import config_dir, register_configs
from dlrm_cache.config.schemas import flatten

CONFIGS = Path(config_dir())
YAMLS = sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*.yaml"))


def _schema_of(raw: DictConfig) -> DictConfig:
    """The schema a YAML file names first in its defaults list (``train_schema``,
    ``/data_schema@_here_``), as registered with Hydra."""
    register_configs()
    first = next(
        d for d in raw.defaults if isinstance(d, str) and d.split("@")[0].endswith("_schema")
    )
    name = first.split("@")[0].lstrip("/")
    node = ConfigStore.instance().load(config_path=f"{name}.yaml").node
    assert isinstance(node, DictConfig)
    return node


def _default_options() -> set[str]:
    """The group options `train` composes when none is named (train.yaml's defaults list; a
    choice naming another group's, ``optim: ${model}``, is that group's default)."""
    raw = OmegaConf.load(CONFIGS / "train.yaml")
    entries = OmegaConf.to_container(raw.defaults, resolve=False)
    choices = {g: o for d in entries if isinstance(d, dict) for g, o in d.items()}
    named = {g: choices[o[2:-1]] if o.startswith("${") else o for g, o in choices.items()}
    return {f"{g}/{o}.yaml" for g, o in named.items()}


def _plain(v: Any) -> Any:
    return (
        [_plain(x) for x in v]
        if isinstance(v, (list, tuple))
        else str(v)
        if hasattr(v, "value")
        else v
    )


def violations(rel: str) -> list[str]:
    """What ``rel`` sets that the schema already says (or says otherwise)."""
    raw = OmegaConf.load(CONFIGS / rel)
    assert isinstance(raw, DictConfig)
    if set(raw.keys()) == {"defaults"} and not any("_schema" in str(d) for d in raw.defaults):
        return []  # another option under this name (optim/small.yaml: the default optimizer)
    schema = _schema_of(raw)
    # a non-default option of a group with several (data/criteo_kaggle.yaml) exists to differ
    preset = (
        "/" in rel
        and rel not in _default_options()
        and len(list((CONFIGS / rel).parent.glob("*.yaml"))) > 1
    )
    sets = {
        k: v
        for k, v in flatten(OmegaConf.to_container(raw)).items()
        if k.split(".")[0] not in ("defaults", "hydra")
    }
    out = []
    for key, value in sets.items():
        if isinstance(value, str) and "${" in value:  # an interpolation: what a schema cannot say
            continue
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(schema, parent) if parent else schema
        if node is None or leaf not in node.keys():  # `in` is False for a MISSING value
            out.append(f"{rel}: {key} is not in the schema")
        elif OmegaConf.is_missing(node, leaf):  # a required value the schema leaves open
            continue
        elif preset and _plain(OmegaConf.to_container(node)[leaf]) != _plain(value):
            continue
        else:
            default = _plain(OmegaConf.to_container(node)[leaf])
            out.append(
                f"{rel}: {key}: {value!r} {'restates' if default == value else 'overrides'} "
                f"the schema's default {default!r}"
            )
    return out


@pytest.mark.parametrize("rel", YAMLS)
def test_yaml_sets_only_what_the_schema_cannot_say(rel: str) -> None:
    assert violations(rel) == []


def test_the_check_sees_a_restated_and_a_contradicting_default(tmp_path: Path, monkeypatch) -> None:
    """The rule above fails on the habit it replaces: a YAML repeating (or changing) a default."""
    import shutil

    configs = tmp_path / "configs"
    shutil.copytree(CONFIGS, configs)
    (configs / "train.yaml").write_text(
        (CONFIGS / "train.yaml").read_text() + "seed: 0\nepochs: 3\n"
    )
    (configs / "model" / "small.yaml").write_text(
        (CONFIGS / "model" / "small.yaml").read_text() + "embedding_dim: 16\n"
    )
    monkeypatch.setitem(globals(), "CONFIGS", configs)
    assert violations("train.yaml") == [
        "train.yaml: seed: 0 restates the schema's default 0",
        "train.yaml: epochs: 3 overrides the schema's default 1",
    ]
    assert violations("model/small.yaml") == [
        "model/small.yaml: embedding_dim: 16 restates the schema's default 16"
    ]


def test_help_offers_only_the_yaml_options(capsys) -> None:
    """`--help` lists each group's options; the schemas are registered outside every group."""
    main(["train", "--help"])
    out = capsys.readouterr().out
    groups = out.split("groups (", 1)[1].split("keys (", 1)[0]
    assert "  embedding  freq_cache, hbm, host (chosen), uvm_cache\n" in groups
    assert "  data       criteo_1tb, criteo_kaggle, synth (chosen)\n" in groups
    assert "_schema" not in groups


def test_the_backend_registry_names_every_placement_once() -> None:
    """train's embedding=<name> options, bench's backends and the registry are the same names."""
    from dlrm_cache.config.choices import Backend
    from dlrm_cache.config.schemas import EMBEDDING_SCHEMAS, backend_target

    options = sorted(p.stem for p in (CONFIGS / "embedding").glob("*.yaml"))
    assert options == sorted(b.value for b in Backend) == sorted(b.value for b in EMBEDDING_SCHEMAS)
    assert backend_target("freq_cache") == "dlrm_cache.embedding.freq_cache.FreqCacheBackend"
