"""What the dispatcher says about overrides before a command runs: a ``-m`` sweep whose jobs would
write one output (refused before any job), and the key a misspelt one most likely meant."""

from __future__ import annotations

import difflib
import math
import re


def output_clash(command: str, configs: str, config_name: str, argv: list[str]) -> str | None:
    """Why the jobs of a ``-m`` sweep would write one output file or directory (`synth -m
    seed=1,2 output=raw`: the second job replaced the first's, exit 0), or None.  `train`'s jobs
    each get their own run directory; an output not swept, without an interpolation (which may
    differ per job), and not null is the same for every job."""
    if command == "train" or not ({"-m", "--multirun"} & set(argv)):
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from .help import compose, overrides_of

    try:
        parsed = OverridesParser.create().parse_overrides(overrides_of(argv))
    except Exception:  # noqa: BLE001 - Hydra reports a bad override in its own line
        return None
    if not any(o.is_sweep_override() for o in parsed):
        return None  # one job
    values = {
        o.key_or_group: list(o.sweep_string_iterator()) for o in parsed if o.is_sweep_override()
    }
    jobs = math.prod(len(v) for v in values.values())
    fixed = [str(o.input_line) for o in parsed if not o.is_sweep_override()]
    try:
        cfg = compose(configs, config_name, fixed)
    except Exception:  # noqa: BLE001 - as above
        return None
    for key in ("output", "figure"):
        node = cfg._get_node(key) if key in cfg else None
        if key in values:
            given = values[key]
            if len(set(given)) >= jobs or any("${" in v for v in given):
                continue
            raw = ",".join(given)
        elif node is None or node._is_none() or node._is_missing() or "${" in str(node._value()):
            continue
        else:
            raw = str(node._value())
        return (
            f"{key}={raw}: the {jobs} jobs of this -m sweep would write fewer outputs than "
            f"jobs (the last job's kept); give every job its own ({key}=a,b,... with nothing "
            f"else swept, or a path with ${{hydra:job.num}} in it)"
        )
    return None


_UNKNOWN_KEY = re.compile(r"Could not override '([^']+)': Key '[^']+' not in ")


def suggestion(configs: str, config_name: str, argv: list[str], line: str) -> str:
    """For an unknown key (``model.embeding_dim=8``), the command's key or group spelled most like
    it (`` (did you mean model.embedding_dim?)``); "" if none is close or the line is another's."""
    if (m := _UNKNOWN_KEY.match(line)) is None:
        return ""
    bad = m.group(1)
    from hydra.core.global_hydra import GlobalHydra

    from ..config.help import keys
    from .help import compose, groups, overrides_of

    others = [o for o in overrides_of(argv) if o.split("=", 1)[0].lstrip("+~") != bad]
    for overrides in (others, []):  # the group options chosen, if the other overrides compose
        GlobalHydra.instance().clear()
        try:
            cfg = compose(configs, config_name, overrides)
            break
        except Exception:  # noqa: BLE001 - a hint only: without one the line stands as it is
            continue
    else:
        return ""
    names = [k.key for k in keys(cfg)] + list(groups(configs, cfg))
    close = difflib.get_close_matches(bad, names, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""
