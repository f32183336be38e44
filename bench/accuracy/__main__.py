"""``python -m bench.accuracy``: run the benchmark and rewrite docs/accuracy.md."""

from __future__ import annotations

import sys

from bench.accuracy.run import main

sys.exit(main())
