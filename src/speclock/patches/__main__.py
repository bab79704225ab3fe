"""`python -m speclock.patches patches apply ...`: what image builds run, with only the patch commands loaded."""

from speclock.cli import main

raise SystemExit(main(modules=["speclock.patches.cli"]))
