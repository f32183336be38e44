"""Fixtures for the rule tests; the job-building helpers live in ``rulejobs.py``."""

from __future__ import annotations

import sys
from pathlib import Path

# test modules import the helpers as ``rulejobs`` whatever pytest's import mode
sys.path.insert(0, str(Path(__file__).parent))
