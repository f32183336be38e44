"""trainguard: catch silent training failures, alert, and stop the job.

The training side (``Hook``, ``SaveConfig``, ``modes``, ``create_trial``) needs only numpy
and boto3; frameworks are imported only when you register a model of theirs.
"""

from __future__ import annotations

from trainguard import modes
from trainguard.version import __version__

__all__ = ["__version__", "modes"]
