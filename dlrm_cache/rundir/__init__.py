"""The run directory: its file names, record kinds and the one writer and reader of its log
(:mod:`.records`; `train` writes, `report` reads), and its records as TensorBoard scalars
(:mod:`.tensorboard`).

May import `config/`, `console/`, `files/`, `data/` and `embedding/`; never `train/` (train imports it).
"""
