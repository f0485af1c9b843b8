"""Figures: what a figure shows as plain data (:mod:`.panels`, no matplotlib) and the drawing
(:mod:`.draw`, the only matplotlib user, imported lazily so that `train` never pays for it).

May import `files/` only.
"""
