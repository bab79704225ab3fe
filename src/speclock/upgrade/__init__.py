"""upgrade: lock, build, check and gate an engine upgrade candidate, then promote it."""
