"""speclock: reproducible, self-checking container builds for EAGLE-3 speculative decoding."""

__version__ = "0.1.0"
