"""Datasets: the processed dataset's contract (:mod:`.format`, :mod:`.schema`, :mod:`.stats`),
raw Criteo text (:mod:`.criteo`, :mod:`.rawtext`, :mod:`.tabular`), `synth`'s planted model
(:mod:`.synth`), `preprocess` (:mod:`.preprocess`), `verify` (:mod:`.verify`) and the loader that
streams shards into batches (:mod:`.loader`).

May import `config/`, `files/`, `concurrency/`, `embedding/` (jagged lists) and `parallel/` (which
rank reads which rows); never `train/`, `model/` or a command.
"""
