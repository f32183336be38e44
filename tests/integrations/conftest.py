"""Shared helpers for the framework callbacks' tests: the stop signal, waiting, offline hubs."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from trainguard.format import layout
from trainguard.format.documents import StopSignal, dump_document

# Models are built from configs; nothing is ever downloaded.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("KERAS_BACKEND", "torch")


def write_stop_signal(job_dir: Path, rule: str = "ExplodingTensor", reason: str = "test stop") -> None:
    """What the service's stop action writes: ``control/stop.json`` in the job's folder."""
    path = Path(job_dir) / layout.STOP_SIGNAL
    path.parent.mkdir(parents=True, exist_ok=True)
    signal = StopSignal(job=Path(job_dir).name, rule=rule, reason=reason, requested_at=time.time())
    path.write_bytes(dump_document(signal))


def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> bool:
    """Poll ``condition`` (a safety net against a hung test, never a timing assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    return tmp_path / "job"
