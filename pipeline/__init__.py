"""profbench pipeline helpers: the job guard (`python -m pipeline.guard`) that turns any
outcome of a run into a result JSON, what the rules do with a run that failed
(`pipeline.outcome`: labelled empty captures and statistics), and the start-up checks
(`pipeline.checks`) that name a machine's problems before any job runs. Standard library
only: they run before the venv's packages are needed."""
