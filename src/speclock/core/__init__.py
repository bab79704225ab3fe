"""core: errors and exit codes, the one file reader/writer, argparse number types, versions, paths.

The bottom layer: imports nothing of speclock above it."""
