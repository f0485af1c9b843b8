"""Overlapping work: a background iterator on a thread (:mod:`.threads`) and a device's streams and
events behind one small interface (:mod:`.streams`).

Imports nothing of the package (a bottom layer); used by the loader, the caches and the trainer.
"""
