"""trainguard: catch silent training failures, alert, and stop the job.

The training side (``Hook``, ``SaveConfig``, ``modes``, ``create_trial``) needs only numpy
and boto3; frameworks are imported only when you register a model of theirs, and boto3
only when the hook first writes to (or a trial first reads from) S3. The names below are
imported lazily, so ``import trainguard`` stays cheap for the service side too.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trainguard import modes
from trainguard.version import __version__

if TYPE_CHECKING:
    from trainguard.hook import (
        Collection,
        CollectionKeys,
        Hook,
        HookReport,
        ReductionConfig,
        SaveConfig,
        SaveConfigMode,
        StepPlan,
        StopTrainingRequested,
        del_hook,
        get_hook,
    )
    from trainguard.trial import Trial, create_trial

_LAZY = {
    "Hook": "trainguard.hook",
    "SaveConfig": "trainguard.hook",
    "SaveConfigMode": "trainguard.hook",
    "Collection": "trainguard.hook",
    "CollectionKeys": "trainguard.hook",
    "StopTrainingRequested": "trainguard.hook",
    "HookReport": "trainguard.hook",
    "ReductionConfig": "trainguard.hook",
    "StepPlan": "trainguard.hook",
    "get_hook": "trainguard.hook",
    "del_hook": "trainguard.hook",
    "create_trial": "trainguard.trial",
    "Trial": "trainguard.trial",
}

__all__ = [
    "Collection",
    "CollectionKeys",
    "Hook",
    "HookReport",
    "ReductionConfig",
    "SaveConfig",
    "SaveConfigMode",
    "StepPlan",
    "StopTrainingRequested",
    "Trial",
    "__version__",
    "create_trial",
    "del_hook",
    "get_hook",
    "modes",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trainguard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
