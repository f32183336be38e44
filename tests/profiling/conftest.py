"""Fixtures for the profiling tests; the batch-building helpers live in ``sysbatches.py``."""

from __future__ import annotations

import sys
from pathlib import Path

# test modules import the helpers as ``sysbatches`` whatever pytest's import mode
sys.path.insert(0, str(Path(__file__).parent))
