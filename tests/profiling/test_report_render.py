"""Render the demo report in headless Chromium: the text it shows, and a screenshot that is a page.

Skips when no Chromium is installed (``apt-get install -y chromium``). To look at the page
yourself: ``python tests/profiling/sysjob.py /tmp/jobs`` then ``trainguard report /tmp/jobs/demo-job``;
``TRAINGUARD_REPORT_SCREENSHOT=docs/img/report.png pytest tests/profiling/test_report_render.py``
keeps the full-page screenshot (the one the README shows).
"""

from __future__ import annotations

import html
import os
import re
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


def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
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
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        *args,
    ]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)


def _shown_text(dom: str) -> str:
    """The page's text as Chromium rendered its DOM (styles and markup dropped)."""
    body = re.sub(r"<style>.*?</style>", " ", dom, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", body)))


@pytest.mark.skipif(_browser() is None, reason="no Chromium: apt-get install -y chromium to run this test")
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    report = Path(generate_report(write_demo_job(tmp_path, diverge=True)))
    profile = tmp_path / "profile"
    dom = _chromium("--dump-dom", report.as_uri(), profile=profile).stdout
    shown = _shown_text(dom)
    for words in (
        "Model rules",
        "ExplodingTensor Issues found step 2970 TRAIN step 2970",  # the model rule that fired, and when
        "Lower the learning rate",  # ... and what to do
        "no training step has started 20 minutes after the job started",  # parameters filled in
        "inf from step 2970",  # the onset of non-finite values
        "1 value above 2.724 not to scale (max 25.7M)",  # what the clipped axis leaves out
        "StepOutlier judges each step against the steps before it, from the 101st on",
    ):
        assert words in shown, words
    assert "`" not in shown

    shot = tmp_path / "report.png"
    _chromium(f"--screenshot={shot}", "--window-size=1280,2400", report.as_uri(), profile=profile)
    width, height, pixels = _png(shot)
    assert (width, height) == (1280, 2400)
    # a blank page filters to (almost) all zero bytes; the report has text, tables and plots
    busy = sum(1 for b in pixels[::97] if b not in (0, 255)) / len(pixels[::97])
    assert busy > 0.02, f"screenshot looks blank ({busy:.3%} busy bytes)"
    assert shot.stat().st_size > 60_000
    keep = os.environ.get("TRAINGUARD_REPORT_SCREENSHOT")
    if keep:  # the whole page, for the README
        _chromium(f"--screenshot={keep}", "--window-size=1280,6300", report.as_uri(), profile=profile)
