"""Files and directories every command shares: atomic writes and checked paths (:mod:`.atomic`),
the file names that mark a dataset, run or checkpoint (:mod:`.layout`), and the rule for where a
command may write its output (:mod:`.outputs`).

A bottom layer: imports nothing of the package outside this folder, so `data/` and `preprocess`
use it without importing the training code.
"""
