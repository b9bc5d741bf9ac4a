"""Studies: the paper's experiment matrices from declarative specs, launched with submitit.

spec.py     the strict YAML schema (``experiments/studies/*.yaml``) and its loader
matrix.py   spec -> cells (validated configs keyed by their config hash)
state.py    each cell's state in the ledger (finished / running / failed / killed / pending)
cell.py     one cell's job: claim it, resume or start its ``factor train``, record the attempt
launch.py   submitit launchers (local processes, Slurm job arrays, debug)
report.py   the paper-layout tables, bootstrap, win counts, cost table and plots
"""
