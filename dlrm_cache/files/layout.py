"""The file names that make a directory one of the tool's: a processed dataset, a run, a checkpoint.

Defined once, here, at the bottom of the import graph (this module imports nothing of the
package), so that every command can tell these directories apart, `preprocess` included, which
must not import the training code.  The modules that write them (:mod:`..data.format`,
:mod:`..rundir.records`, :mod:`..train.checkpoint`) import their names from here and describe their contents.
"""

from __future__ import annotations

from typing import Final

# A processed dataset: its manifest, written last (its presence marks a complete dataset).
MANIFEST: Final = "manifest.json"

# A run directory (rundir/records.py): the log every run writes, the summary of a finished run, its
# checkpoints, and what a resume from an older checkpoint set aside (train/branch.py).
METRICS: Final = "metrics.jsonl"
SUMMARY: Final = "summary.json"
CKPT_DIR: Final = "checkpoints"
ABANDONED: Final = "abandoned"
SNAPSHOT: Final = ".hydra"  # Hydra's snapshot of a job's config (hydra.output_subdir)

# A checkpoint directory (train/checkpoint.py): its metadata, written last, and its dense part.
CKPT_META: Final = "meta.json"
CKPT_DENSE: Final = "dense.pt"
