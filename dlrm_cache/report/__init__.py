"""Reading numbers back for people: run directories as `report` reads them (:mod:`.runs`), the
report's series, figure and summary (:mod:`.report`), and `plan`'s cache sizing from a dataset's
frequency statistics (:mod:`.sizing`).

May import every library layer below it (`config/` ... `train/`, `plots/`, `rundir/`); the
commands import it, nothing else does.
"""
