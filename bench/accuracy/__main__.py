"""``python -m bench.accuracy``: the accuracy benchmark v2 (see ``bench/accuracy/cli.py``)."""

from __future__ import annotations

import sys

from bench.accuracy.cli import main

sys.exit(main())
