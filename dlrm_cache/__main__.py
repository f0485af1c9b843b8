"""`python -m dlrm_cache`: the CLI, or one line when this Python lacks its dependencies (a system
``python3`` outside the project's ``.venv`` has no torch, hydra, ...)."""

import sys

try:
    from .cli import main
except ModuleNotFoundError as e:
    if not e.name or e.name.split(".")[0] == __package__:  # our own import bug: its traceback
        raise
    print(
        f"dlrm-cache: error: {sys.executable} has no module {e.name!r}, which dlrm-cache needs: "
        "run .venv/bin/dlrm-cache (`make install` creates .venv), or pip install this "
        "package into this Python",
        file=sys.stderr,
    )
    raise SystemExit(1) from None

main()
