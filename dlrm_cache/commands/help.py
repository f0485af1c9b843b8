"""What the dispatcher answers without running a command: a command's ``--help`` and bash
completion (``dlrm-cache -sc install=bash``), both from the command's composed config and its
schema (:mod:`..config.help`), so they list exactly the keys the command takes.

Hydra's own help and completion do not fit a dispatcher in front of several apps: they list every
config group under the shared config directory for every command, and its completion script
registers and queries ``dlrm-cache`` without the command word.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig

from ..config.help import format_help, keys

HELP_FLAGS = ("--help", "-h")
FLAGS = ["--help", "--cfg", "-m"]
# the words a command takes before its overrides (the dispatcher splits them off)
POSITIONAL = {
    "report": "RUN_DIR [RUN_DIR ...] ",
    "verify": "DATASET ",
}  # what completion offers besides keys (Hydra's flags)

BASH_SCRIPT = """\
_dlrm_cache_completion()
{
    local choices
    choices=$(COMP_POINT=$COMP_POINT COMP_LINE=$COMP_LINE "${COMP_WORDS[0]}" -sc query=bash 2>/dev/null)
    COMPREPLY=($(compgen -W "$choices" -- "${COMP_WORDS[COMP_CWORD]}"))
}
COMP_WORDBREAKS=${COMP_WORDBREAKS//=}
complete -o nospace -o default -F _dlrm_cache_completion dlrm-cache"""


def compose(config_dir: str, config_name: str, overrides: list[str]) -> DictConfig:
    """The command's config as it would run (Hydra's settings included: the group choices)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        return hydra_compose(config_name, overrides=overrides, return_hydra_config=True)


def groups(config_dir: str, cfg: DictConfig) -> dict[str, tuple[str, list[str]]]:
    """The config groups the command composes: name -> (the option chosen, every option)."""
    out = {}
    for group, chosen in sorted(cfg.hydra.runtime.choices.items()):
        if group.startswith("hydra/") or chosen is None:
            continue
        options = sorted(p.stem for p in (Path(config_dir) / group).glob("*.yaml"))
        out[group] = (chosen, options)
    return out


def overrides_of(argv: list[str]) -> list[str]:
    """The ``key=value`` words of a command line (flags and their values left out)."""
    return [a for a in argv if "=" in a and not a.startswith("-")]


def command_help(config_dir: str, command: str, config_name: str, summary: str, argv: list[str]):
    cfg = compose(config_dir, config_name, overrides_of(argv))
    return format_help(command, summary, cfg, groups(config_dir, cfg), POSITIONAL.get(command, ""))


def complete(config_dir: str, commands: dict[str, str], line: str) -> list[str]:
    """The words that may follow ``line`` (the command line up to the cursor); ``commands``: the
    command -> its config name."""
    words = line.split()
    current = "" if not words or line.endswith(" ") else words.pop()
    if len(words) <= 1:
        return [c for c in commands if c.startswith(current)]
    if words[1] not in commands:
        return []
    try:
        cfg = compose(config_dir, commands[words[1]], overrides_of(words[2:]))
    except Exception:  # a bad earlier word: nothing to offer (the command itself will say why)
        return []
    offered = dict.fromkeys(FLAGS)
    for group, (_, options) in groups(config_dir, cfg).items():
        offered.update(dict.fromkeys(f"{group}={o}" for o in options))
    for k in keys(cfg):
        choices = k.kind.split("|") if "|" in k.kind and "[" not in k.kind else []
        if k.kind == "bool":
            choices = ["true", "false"]
        values = [c for c in choices if c != "null"] or [k.default]
        offered.update(dict.fromkeys(f"{k.key}={v}" for v in values))
    if "=" not in current:  # a key: offer `key=` once, not every value
        offered = {w.split("=", 1)[0] + ("=" if "=" in w else ""): None for w in offered}
    return [w for w in offered if w.startswith(current)]


def shell_completion(config_dir: str, commands: dict[str, str], argv: list[str]) -> str:
    """``-sc install=bash`` (the script to eval) or ``-sc query=bash`` (the completions of the
    line in COMP_LINE, up to COMP_POINT)."""
    request = argv[argv.index("-sc") + 1] if argv.index("-sc") + 1 < len(argv) else ""
    if request == "install=bash":
        return BASH_SCRIPT
    if request == "query=bash":
        line = os.environ.get("COMP_LINE", "")
        point = int(os.environ.get("COMP_POINT", len(line)))
        return " ".join(complete(config_dir, commands, line[:point]))
    raise ValueError(f"-sc {request}: bash completion only: -sc install=bash")
