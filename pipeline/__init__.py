"""The pipeline's own helpers: job guard, failure outcomes, start-up checks."""
