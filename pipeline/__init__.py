"""profbench's pipeline: the job guard and what it uses (pipeline/guard.py), the start-up
checks, the config. Standard library only."""
