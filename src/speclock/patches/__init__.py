"""patches: engine source patch series (parse, apply all or nothing, probe); `python -m speclock.patches` runs its CLI."""
