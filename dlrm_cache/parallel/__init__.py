"""Several processes: the process group and device (:mod:`.dist`), where each table lives
(:mod:`.placement`), which rank reads which rows (:mod:`.owned`) and the sharded backend
(:mod:`.sharded`).

May import `config/` and `embedding/` only (`data/` imports it for the ranks' rows).
"""
