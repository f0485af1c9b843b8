"""The commands: one thin module per command (``train``, ``preprocess``, ``synth``, ``plan``,
``bench``, ``report``, ``verify``, ``predict``, ``export``), each taking its composed config and
calling the library; plus what the dispatcher needs before any command runs: Hydra's registration
of every schema (:mod:`.store`) and ``--help`` / completion (:mod:`.help`).

The top layer: may import anything below; only ``cli.py`` imports it.  This ``__init__`` and
:mod:`.store` / :mod:`.help` must not import torch (the dispatcher starts without it): a command
module imports its library when it runs.
"""
