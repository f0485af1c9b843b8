"""The configuration's schemas: every command's keys, their types, defaults and ranges.

:mod:`.choices` (the choice fields' enums), :mod:`.ranges` (allowed values, checked in one place),
:mod:`.schemas` (the dataclasses Hydra composes) and :mod:`.help` (a command's ``--help`` from its
schema).  The bottom of the import graph: imports nothing of the package, and neither Hydra nor torch
at import time, so `embedding/`, `model/` and `bench/` take the enums without pulling in `data/`.
"""
