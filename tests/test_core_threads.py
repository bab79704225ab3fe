"""The CPU thread budget of speclock's own torch work (core/threads.py): OMP_NUM_THREADS, when set, is kept."""

from __future__ import annotations

import os

import pytest

from speclock.core.threads import cpu_threads


@pytest.mark.parametrize(("value", "want"), [("1", 1), (" 3 ", 3), ("0", None), ("-2", None), ("two", None), ("", None)])
def test_omp_num_threads_caps_the_threads_when_it_is_a_positive_number(monkeypatch, value, want):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert cpu_threads() == (want or os.cpu_count() or 1)


def test_without_omp_num_threads_every_core(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert cpu_threads() == (os.cpu_count() or 1)
