"""After training: a trained run's checkpoint as a model (:mod:`.trained`), `predict` over raw
Criteo text (:mod:`.rawinput`, :mod:`.rawbatch`) or a split (:mod:`.predict`), `export` to
torchrec's DLRM (:mod:`.export`), and their config schemas (:mod:`.config`, free of torch).

May import every library layer below it (`config/` ... `train/`, `rundir/`); only `commands/`
imports it.
"""
