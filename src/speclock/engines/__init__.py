"""Inference engines behind one small interface (see the engines package in main)."""
