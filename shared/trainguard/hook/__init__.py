"""The training-side hook: ``Hook``, save configurations, collections, the stop request.

Importing this package imports numpy and pydantic only; PyTorch is imported when a module
is registered, boto3 when the first object is written to S3.
"""

from __future__ import annotations

from trainguard.hook.config import Collection, CollectionKeys, ReductionConfig, SaveConfig, SaveConfigMode
from trainguard.hook.core import Hook, HookReport, del_hook, get_hook
from trainguard.hook.steps import StepPlan
from trainguard.hook.stopping import StopTrainingRequested

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
    "del_hook",
    "get_hook",
]
