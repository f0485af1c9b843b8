"""Embedding tables behind one interface (:class:`.base.EmbeddingBackend`): host, hbm and
uvm_cache (:mod:`.direct`, :mod:`.tbe`), the frequency-aware cache (:mod:`.freq_cache`), hit
rates (:mod:`.rates`) and the jagged id lists their inputs are built from (:mod:`.jagged`).

May import `config/` (the choice enums) and `concurrency/` only: never `data/`, so the model and
bench take a backend without the datasets' code.
"""
