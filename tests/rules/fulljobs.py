"""A job that saves everything every rule could read, healthy or with one fault switched on.

Used by ``test_reads.py`` (every rule's ``reads()`` covers what it reads) and
``test_coverage.py`` (no rule passes without having checked its input). Each step holds TRAIN
losses and, every 5th step, an EVAL phase; tensors of every built-in collection with honest
statistics (``rulejobs.tensor``) and the extras the hook computes for them (``unit_active``,
``unit_in_band``, ``values``, ``value_counts``, ``update_l2``), XGBoost importances and trees,
and an unrelated ``default`` tensor and ``metrics`` scalar that no rule should need.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
from rulejobs import M, header, scalar, tensor
from trainguard.format.documents import StepHeader, TensorRecord
from trainguard.rules.base import StepData

TANH = (-9.4999, 9.4999)
SIGMOID = (-23.0, 16.99999)

#: faults a job can carry (each makes at least one rule fire)
FAULTS = (
    "nan_loss",
    "diverging",
    "converged",
    "flat_loss",
    "overfit",
    "oscillating",
    "vanishing",
    "exploding_ratio",
    "dead_relu",
    "saturated",
    "poor_init",
    "huge_update",
    "zero_weights",
    "frozen",
    "huge_variance",
    "imbalanced",
    "confused",
    "raw_images",
    "padding",
    "overweight",
    "deep_trees",
)


def _units(active: float, units: int = 8) -> list[float]:
    return [active] * units


def job(faults: Iterable[str] = (), steps: int = 60, every: int = 1) -> list[StepData]:
    """The job's steps 0, every, 2*every, ... below ``steps``."""
    on = set(faults)
    unknown = on - set(FAULTS)
    assert not unknown, unknown
    return [job_step(s, on) for s in range(0, steps, every)]


def job_step(s: int, on: set[str]) -> StepData:
    rng = np.random.default_rng(s)
    train_loss = 2.0 / (1 + 0.2 * s) + 0.01 * rng.random()
    if "flat_loss" in on:
        train_loss = 0.668413
    if "oscillating" in on:
        train_loss = 1.0 + (0.5 if s % 2 else -0.5)
    if "converged" in on:
        train_loss = 0.5 + 1.5 * math.exp(-s / 4) + 0.01 * rng.random()
    if "diverging" in on and s >= 40:
        train_loss *= 10.0 ** (5 + s - 40)  # finite, orders of magnitude above its level
    if "nan_loss" in on and s >= 30:
        train_loss = math.nan
    eval_loss = train_loss * (3.0 if "overfit" in on else 1.02)

    frozen = "frozen" in on
    w_scale = 0.0 if "zero_weights" in on else (30.0 if "huge_variance" in on else 0.3)
    w1 = (
        np.zeros((8, 4))
        if w_scale == 0
        else np.random.default_rng(0 if frozen else s).normal(0, w_scale, (8, 4))
    )
    w2 = np.random.default_rng(1 if frozen else s + 1000).normal(0, 0.3, (4, 8))
    g_scale = 1e-12 if "vanishing" in on else 1e-2
    g1 = rng.normal(0, g_scale * (1e-6 if "exploding_ratio" in on else 1.0), (8, 4))
    g2 = rng.normal(0, g_scale, (4, 8))
    if "poor_init" in on:
        g1 = np.full((8, 4), 1e-3)
    update = 1e3 if "huge_update" in on else 0.01

    labels = rng.integers(0, 3, size=60)
    if "imbalanced" in on:
        labels = np.where(rng.random(60) < 0.97, 0, labels)
    preds = labels.copy() if "confused" not in on else (labels + 1) % 3
    images = rng.normal(128, 40, (4, 3, 4, 4)) if "raw_images" in on else rng.normal(0, 1, (4, 3, 4, 4))
    tokens = rng.integers(1, 50, size=(4, 16))
    if "padding" in on:
        tokens[:, 4:] = 0
    importance = [50.0, 40.0, 5.0, 3.0, 2.0] if "overweight" in on else [20.0, 20.0, 20.0, 20.0, 20.0]
    deepest = 120.0 if "deep_trees" in on else 14.0

    relu_active = 0.002 if "dead_relu" in on else 0.6
    in_band = 0.0 if "saturated" in on else 0.95
    act_scale = (1.0, 100.0) if "poor_init" in on else (1.0, 1.2)

    tensors: dict[str, TensorRecord] = {
        "fc1.weight": tensor(w1, ["weights"], update_l2=update * float(np.linalg.norm(w1) + 1)),
        "fc2.weight": tensor(w2, ["weights"], update_l2=update * float(np.linalg.norm(w2))),
        "fc1.bias": tensor(np.full(4, 0.1) if frozen else rng.normal(0, 0.1, 4), ["biases"]),
        "gradient/fc1.weight": tensor(g1, ["gradients"]),
        "gradient/fc2.weight": tensor(g2, ["gradients"]),
        "fc1/relu_output": tensor(
            np.abs(rng.normal(0, 1, (16, 8))), ["relu_output"], unit_active=_units(relu_active)
        ),
        "fc1/relu_input": tensor(rng.normal(0, act_scale[0], (16, 8)), ["relu_input"]),
        "fc2/relu_input": tensor(rng.normal(0, act_scale[1], (16, 8)), ["relu_input"]),
        "fc3/tanh_input": tensor(
            rng.normal(0, 1, (16, 8)), ["tanh_input"], unit_in_band=_units(in_band), band=TANH
        ),
        "fc4/sigmoid_input": tensor(
            rng.normal(0, 1, (16, 8)), ["sigmoid_input"], unit_in_band=_units(in_band), band=SIGMOID
        ),
        "model_input_0": tensor(images, ["inputs"]),
        "model_input_1": tensor(tokens, ["inputs"], dtype="int64", values=tokens.ravel().tolist()),
        "trees/Node": tensor(np.arange(deepest + 1), ["trees"]),
        "unrelated": tensor(rng.normal(0, 1, (3, 3)), ["default"]),
    }
    train_scalars: dict[str, Any] = {
        "loss": scalar(train_loss),
        "accuracy": scalar(0.5, ["metrics"]),
    }
    for i, v in enumerate(importance):
        train_scalars[f"feature_importance/weight/f{i}"] = scalar(v, ["feature_importance"])
    modes = {"TRAIN": M(s, train_scalars, tensors)}
    if s % 5 == 0:
        modes["EVAL"] = M(
            s // 5,
            {"loss": scalar(eval_loss)},
            {
                "CrossEntropyLoss/labels": tensor(labels, ["labels"], dtype="int64", values=labels.tolist()),
                "CrossEntropyLoss/predictions": tensor(
                    preds, ["predictions"], dtype="int64", values=preds.tolist()
                ),
            },
        )
    return StepData.from_headers([header(s, modes)])


def with_headers(steps: Iterable[StepData], edit: Any) -> list[StepData]:
    """Each step with every header passed through ``edit(header) -> header``."""
    out = []
    for sd in steps:
        headers: list[StepHeader] = [edit(h) for h in sd.workers]
        out.append(StepData(sd.step, tuple(headers), sd.wall_time))
    return out
