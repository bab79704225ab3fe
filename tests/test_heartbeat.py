"""Progress for long silent work: a download reports bytes, total and rate while it runs (a real HTTP download
from a local server through the fetch path), and a builder step that prints nothing gets a heartbeat line
saying for how long and how fast the disk fills (a real child process that writes to disk silently)."""

from __future__ import annotations

import sys
import threading

from fetch_server import WheelServer, wheel_entry

from speclock.build import wheelhouse
from speclock.build.builders import _proc
from speclock.core import heartbeat
from speclock.core.heartbeat import ByteHeartbeat, human_bytes


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_byte_heartbeat_reports_at_most_once_per_interval_with_total_and_rate():
    clock, lines = Clock(), []
    beat = ByteHeartbeat("torch.whl", progress=lines.append, every_s=10, clock=clock)
    beat.add(5_000_000)
    assert lines == []  # nothing before the interval: short downloads stay quiet
    beat.set_total(100_000_000)
    clock.now += 10
    beat.add(45_000_000)
    assert lines == ["  ... torch.whl: 50.0 MB of 100.0 MB (50%), 5.0 MB/s"]
    clock.now += 4
    beat.add(10_000_000)
    assert len(lines) == 1  # within the next interval: no second line
    clock.now += 6
    beat.add(0)
    assert lines[-1] == "  ... torch.whl: 60.0 MB of 100.0 MB (60%), 3.0 MB/s"


def test_without_a_known_size_the_line_has_bytes_and_rate_only():
    clock, lines = Clock(), []
    beat = ByteHeartbeat("x.whl", progress=lines.append, every_s=1, clock=clock)
    clock.now += 2
    beat.add(2_000)
    assert lines == ["  ... x.whl: 2.0 kB, 1.0 kB/s"]
    assert human_bytes(999) == "999 B" and human_bytes(1_500_000_000) == "1.5 GB"


def test_a_real_download_reports_its_progress(tmp_path, monkeypatch):
    monkeypatch.setattr(heartbeat, "EVERY_S", 0.2)
    server = WheelServer()
    try:
        data = b"w" * 300_000  # "slow" mode trickles 4 kB every 50 ms: about 4 s
        pkg = wheel_entry(server, "big-wheel", data=data, mode="slow")
        lines: list[str] = []
        path, outcome = wheelhouse.ensure_entry(pkg, tmp_path / "store", progress=lines.append)
    finally:
        server.close()
    assert outcome == "downloaded" and path.read_bytes() == data
    assert len(lines) >= 5, lines
    assert all(line.startswith(f"  ... {pkg['filename']}: ") and line.endswith("/s") for line in lines)
    assert "of 300.0 kB (" in lines[-1]  # the Content-Length became the total
    done = [float(line.split(": ")[1].split(" kB")[0]) for line in lines]
    assert done == sorted(done) and done[-1] <= 300.0  # bytes only grow, never past the size


def test_a_silent_builder_step_gets_heartbeat_lines_with_the_disk_it_fills(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(heartbeat, "SILENCE_S", 0.6)
    out = tmp_path / "layer.bin"
    # Like a layer commit: writes 30 MB and prints nothing for about 2.5 s, then one line.
    script = (
        f"import os, time\nwith open({str(out)!r}, 'wb') as f:\n    f.write(b'0' * 30_000_000); f.flush(); "
        f"os.fsync(f.fileno())\ntime.sleep(2.5)\nprint('COMMIT done', flush=True)\n"
    )
    rc, tail = _proc.stream([sys.executable, "-c", script], watch=tmp_path)
    err = capfd.readouterr().err
    assert rc == 0 and tail.endswith("COMMIT done")
    beats = [line for line in err.splitlines() if "no output for" in line]
    assert beats, err
    assert all(line.startswith("  | (still running, no output for ") for line in beats)
    assert f"more used on the disk holding {tmp_path}" in beats[0] and beats[0].endswith("/s)")
    assert err.index(beats[-1]) < err.index("COMMIT done")


def test_a_quiet_stream_prints_no_heartbeat(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(heartbeat, "SILENCE_S", 0.3)
    rc, _ = _proc.stream([sys.executable, "-c", "import time; time.sleep(1.2)"], quiet=True, watch=tmp_path)
    assert rc == 0 and capfd.readouterr().err == ""
    assert threading.active_count() < 50
