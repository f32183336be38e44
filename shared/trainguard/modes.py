"""Training modes, as smdebug names them (``trainguard.modes.TRAIN``...)."""

from __future__ import annotations

from enum import Enum


class ModeKeys(str, Enum):
    TRAIN = "TRAIN"
    EVAL = "EVAL"
    PREDICT = "PREDICT"
    GLOBAL = "GLOBAL"


TRAIN = ModeKeys.TRAIN
EVAL = ModeKeys.EVAL
PREDICT = ModeKeys.PREDICT
GLOBAL = ModeKeys.GLOBAL
