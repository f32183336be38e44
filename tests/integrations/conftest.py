"""Shared fixtures for the framework callbacks' tests (helpers: callback_helpers.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Models are built from configs; nothing is ever downloaded.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("KERAS_BACKEND", "torch")


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    return tmp_path / "job"
