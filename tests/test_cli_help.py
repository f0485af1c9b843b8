"""`dlrm-cache --help`, `dlrm-cache <command> --help` and bash completion, through the dispatcher:
each command lists its own keys (type, default, range, meaning), and completion offers them."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from launching import REPO
from omegaconf import OmegaConf

from dlrm_cache.cli import COMMANDS, main
from dlrm_cache.commands.store import config_dir, register_configs
from dlrm_cache.config.help import field_meanings
from dlrm_cache.config.schemas import flatten


def _main(capsys, *args: str) -> str:
    main(list(args))
    out = capsys.readouterr()
    assert out.err == ""
    return out.out


def _composed_keys(config_name: str, overrides: list[str]) -> set[str]:
    """The command's keys, from Hydra's composition (independently of the help's schema walk)."""
    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(config_name, overrides=overrides)
    flat = flatten(OmegaConf.to_container(cfg, resolve=False))
    return {k for k in flat if "_target_" not in k}


def test_the_command_list_names_every_command(capsys):
    out = _main(capsys, "--help")
    for name, (_, _, summary) in COMMANDS.items():
        assert f"  {name:<11} {summary}\n" in out
    assert "powered by Hydra" not in out


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_lists_its_own_keys(capsys, command: str):
    out = _main(capsys, command, "--help")
    assert "powered by Hydra" not in out and out.startswith(f"dlrm-cache {command}: ")
    listed = {
        line.split("=", 1)[0].strip()
        for line in out.splitlines()
        if line.startswith("  ") and not line.startswith("   ") and "=" in line
    }
    keys = _composed_keys(COMMANDS[command][0], [])
    assert keys <= listed, sorted(keys - listed)
    # groups only where the command composes them (train's groups are refused by the others)
    assert ("\n  optim " in out) == (command == "train")


def test_a_key_shows_type_default_range_and_meaning(capsys):
    out = _main(capsys, "train", "embedding=freq_cache", "data.batch_size=512", "--help")
    assert "  embedding.cache_ratio=0.015  (float, > 0 and <= 1)\n" in out
    assert "      fraction of all rows held in the device cache\n" in out
    assert "  embedding.policy=freq  (freq|lfu|lru)\n" in out
    assert "  data.batch_size=512  (int, >= 1)\n" in out  # the overrides given are applied
    assert "  max_steps=-1  (int, >= 1 or -1)\n      stop after this many steps" in out
    assert "  embedding  freq_cache (chosen), hbm, host, uvm_cache\n" in out
    # plan composes the same groups as train, without train's own keys
    plan = _main(capsys, "plan", "--help")
    assert "  data.batch_size=1024  (int, >= 1)\n" in plan
    assert "max_steps" not in plan and "  ratios=[0.001,0.005,0.015,0.05,0.1]  (" in plan


def test_each_meaning_stands_in_its_own_command_help(capsys):
    """A newcomer met preprocess's ``cache_mb`` ("unused": a key that did nothing), bench
    ``kind``'s "(see above)" (nothing is above a key in the help) and export's ``dataset`` ending
    in a sentence about predict."""
    helps = {c: _main(capsys, c, "--help") for c in COMMANDS}
    assert not [c for c, h in helps.items() if "unused" in h or "see above" in h]
    assert "cache_mb" not in helps["preprocess"]
    assert "embedding (the embedding layer alone) | train" in helps["bench"]
    export_dataset = helps["export"].split("  dataset=", 1)[1].split("\n  output=", 1)[0]
    assert "predict" not in export_dataset and "processed input" not in export_dataset
    assert "a processed input itself" in helps["predict"]


def test_a_bad_override_before_help_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "nosuchkey=1", "--help"])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nosuchkey" in err and err.startswith("dlrm-cache plan: error")


def test_every_schema_field_has_a_meaning():
    from hydra.core.config_store import ConfigStore

    register_configs()
    schemas = {
        node.node._metadata.object_type
        for name, node in ConfigStore.instance().repo.items()
        if name.endswith("_schema.yaml")
    }
    missing = [
        f"{s.__name__}.{f.name}"
        for s in schemas
        for f in dataclasses.fields(s)
        if not f.name.startswith("_")
        and not dataclasses.is_dataclass(typing.get_type_hints(s)[f.name])  # a node: its keys
        and not field_meanings(s).get(f.name)
    ]
    assert len(schemas) >= 12 and missing == []


@pytest.fixture(scope="module")
def bash_with_completion(tmp_path_factory) -> Path:
    """A bin directory with `dlrm-cache` (this checkout) for bash's PATH."""
    bin_dir = tmp_path_factory.mktemp("bin")
    exe = bin_dir / "dlrm-cache"
    exe.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m dlrm_cache "$@"\n')
    exe.chmod(0o755)
    return bin_dir


def _complete(bin_dir: Path, line: str) -> list[str]:
    """What bash offers after ``line`` with the installed completion (as pressing tab runs it)."""
    script = (
        'eval "$(dlrm-cache -sc install=bash)"\n'
        "complete -p dlrm-cache | grep -q _dlrm_cache_completion || exit 3\n"
        f"COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}\n"
        'read -ra COMP_WORDS <<< "$COMP_LINE"\n'
        '[[ "$COMP_LINE" == *" " ]] && COMP_WORDS+=("")\n'
        "COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))\n"
        "_dlrm_cache_completion\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    res = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 0, res.stderr
    return [w for w in res.stdout.splitlines() if w]


def test_bash_completion_offers_the_commands_and_their_keys(bash_with_completion: Path):
    assert _complete(bash_with_completion, "dlrm-cache pl") == ["plan"]
    assert _complete(bash_with_completion, "dlrm-cache plan data.batch") == ["data.batch_size="]
    assert _complete(bash_with_completion, "dlrm-cache plan opt") == []  # train's group only
    assert _complete(
        bash_with_completion, "dlrm-cache train embedding=freq_cache embedding.policy=l"
    ) == ["embedding.policy=lfu", "embedding.policy=lru"]
    assert "embedding=freq_cache" in _complete(bash_with_completion, "dlrm-cache train embedding=")
