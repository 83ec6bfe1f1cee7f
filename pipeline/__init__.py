"""profbench pipeline helpers: the job guard (`python -m pipeline.guard`) that turns any
outcome of a run into a result JSON, and the start-up checks (`pipeline.checks`) that name a
machine's problems before any job runs. Standard library only: both run before the venv's
packages are needed."""
