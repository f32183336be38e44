"""Render the demo report in headless Chromium and check the screenshot is a real page.

Skips when no Chromium is installed (``apt-get install -y chromium``). To look at the page
yourself: ``python tests/profiling/sysjob.py /tmp/jobs`` then ``trainguard report /tmp/jobs/demo-job``.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from sysjob import write_demo_job
from trainguard.report import generate_report

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _browser() -> str | None:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def _png(path: Path) -> tuple[int, int, bytes]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, size = 8, b"", (0, 0)
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    return size[0], size[1], zlib.decompress(idat)


@pytest.mark.skipif(_browser() is None, reason="no Chromium: apt-get install -y chromium to run this test")
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    report = Path(generate_report(write_demo_job(tmp_path)))
    shot = tmp_path / "report.png"
    profile = tmp_path / "profile"
    cmd = [
        str(_browser()),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--screenshot={shot}",
        "--window-size=1280,2400",
        report.as_uri(),
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    width, height, pixels = _png(shot)
    assert (width, height) == (1280, 2400)
    # a blank page filters to (almost) all zero bytes; the report has text, tables and plots
    busy = sum(1 for b in pixels[::97] if b not in (0, 255)) / len(pixels[::97])
    assert busy > 0.02, f"screenshot looks blank ({busy:.3%} busy bytes)"
    assert shot.stat().st_size > 60_000
