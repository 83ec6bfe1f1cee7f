"""Outputs across runs: summary, ladders, speed-ups, findings, overview, figures."""
