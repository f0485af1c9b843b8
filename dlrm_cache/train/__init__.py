"""`train`'s library: the run's set-up (:mod:`.build`), the step (:mod:`.step`, shared with bench),
the loop (:mod:`.loop`), evaluation and metrics, checkpoints and resuming, the run directory's
claim (:mod:`.claim`) and the guards that stop a bad run.

May import every layer below it (`config/`, `console/`, `concurrency/`, `files/`, `embedding/`,
`model/`, `parallel/`, `rundir/`, `data/`); `bench/`, `report/` and `after/` import it.
"""
