"""EAGLE-3 drafter training: data, hidden states, the drafter, training, export (see docs/training.md)."""
