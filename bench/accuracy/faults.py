"""Base configurations, fault injections and which rules claim each fault.

A fault is a set of ``RunConfig`` overrides applied to one base configuration; its clean
twin is that base with the same seed (so faults on one base share their twins). Injections
follow AUTOTRAINER, DeepFD and TheDeepChecker (see /work/shared/notes/fault-recipes.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.accuracy.tasks import RunConfig

#: training steps of every run: six saves at the hook's default tensor interval (50)
STEPS = 300

#: clean base configurations (each also run as the clean twin of its faults)
BASES: dict[str, RunConfig] = {
    "circles-relu": RunConfig(task="circles", act="relu", lr=0.005, steps=STEPS),
    "circles-tanh": RunConfig(task="circles", act="tanh", lr=0.005, steps=STEPS),
    "circles-sigmoid": RunConfig(task="circles", act="sigmoid", lr=0.005, steps=STEPS),
    "digits-cnn": RunConfig(task="digits", arch="cnn", lr=0.003, steps=STEPS, n_train=2000),
    "digits-mlp": RunConfig(task="digits", act="relu", hidden=(64, 32), lr=0.002, steps=STEPS, n_train=2000),
}


@dataclass(frozen=True)
class Fault:
    name: str
    base: str
    changes: dict[str, Any]
    #: the rules whose documented symptom this injection is meant to produce
    claims: tuple[str, ...]
    what: str = ""

    def config(self, seed: int) -> RunConfig:
        return BASES[self.base].but(seed=seed, **self.changes)


FAULTS: tuple[Fault, ...] = (
    Fault(
        "exploding-lr",
        "circles-relu",
        {"optimizer": "sgd", "lr": 1e4},
        ("ExplodingTensor",),
        "SGD with learning rate 1e4",
    ),
    Fault(
        "exploding-lr",
        "digits-cnn",
        {"optimizer": "sgd", "lr": 1e4},
        ("ExplodingTensor",),
        "SGD with learning rate 1e4",
    ),
    Fault(
        "deep-sigmoid",
        "circles-sigmoid",
        {"hidden": (16,) * 10, "optimizer": "sgd", "lr": 0.1},
        ("VanishingGradient", "GradientNormRatio"),
        "10 sigmoid layers of 16 units, SGD lr 0.1",
    ),
    Fault(
        "dead-relu-bias",
        "circles-relu",
        {"bias_init": -10.0},
        ("DeadRelu",),
        "every hidden bias initialised to -10",
    ),
    Fault(
        "dead-relu-bias",
        "digits-cnn",
        {"bias_init": -10.0},
        ("DeadRelu",),
        "every hidden bias initialised to -10",
    ),
    Fault(
        "dead-relu-lr",
        "circles-relu",
        {"optimizer": "sgd", "lr": 3.0},
        ("DeadRelu",),
        "SGD with learning rate 3 (ReLU units die)",
    ),
    Fault(
        "saturated-tanh",
        "circles-tanh",
        {"bias_init": 20.0},
        ("SaturatedActivation",),
        "every hidden bias initialised to 20 (tanh band: +-9.5)",
    ),
    Fault(
        "saturated-sigmoid",
        "circles-sigmoid",
        {"bias_init": -40.0},
        ("SaturatedActivation",),
        "every hidden bias initialised to -40 (sigmoid band: -23..17)",
    ),
    Fault(
        "unscaled-inputs",
        "circles-tanh",
        {"input_scale": 100.0},
        ("DataNotNormalized",),
        "standardised inputs multiplied by 100 into a tanh MLP",
    ),
    Fault(
        "raw-pixels",
        "digits-cnn",
        {"raw_pixels": True},
        ("CheckInputImages", "DataNotNormalized"),
        "images left in 0-255",
    ),
    Fault(
        "unscaled-inputs",
        "circles-relu",
        {"input_scale": 100.0},
        ("DataNotNormalized",),
        "standardised inputs multiplied by 100",
    ),
    Fault(
        "lr-zero",
        "circles-relu",
        {"lr": 0.0},
        ("LossNotDecreasing", "UnchangedTensor", "WeightUpdateRatio", "PoorWeightInitialization"),
        "learning rate 0",
    ),
    Fault(
        "lr-zero",
        "digits-cnn",
        {"lr": 0.0},
        ("LossNotDecreasing", "UnchangedTensor", "WeightUpdateRatio", "PoorWeightInitialization"),
        "learning rate 0",
    ),
    Fault(
        "lr-tiny",
        "digits-mlp",
        {"optimizer": "sgd", "lr": 1e-13},
        ("WeightUpdateRatio", "UnchangedTensor", "LossNotDecreasing"),
        "SGD with learning rate 1e-13",
    ),
    Fault(
        "frozen-layer",
        "circles-relu",
        {"frozen": ("0.",)},
        ("UnchangedTensor", "WeightUpdateRatio"),
        "first layer frozen (requires_grad=False)",
    ),
    Fault(
        "zero-init",
        "circles-relu",
        {"zero_init": True},
        ("AllZero", "VanishingGradient", "DeadRelu", "UnchangedTensor"),
        "every weight and bias initialised to 0",
    ),
    Fault(
        "zero-init",
        "digits-mlp",
        {"zero_init": True},
        ("AllZero", "VanishingGradient", "DeadRelu", "UnchangedTensor"),
        "every weight and bias initialised to 0",
    ),
    Fault(
        "poor-init",
        "digits-mlp",
        {"layer_gain": ((1, 0.01),)},
        ("PoorWeightInitialization",),
        "second layer's initial weights multiplied by 0.01",
    ),
    Fault(
        "oscillating",
        "circles-relu",
        {"optimizer": "sgd", "lr": 0.5, "momentum": 0.9, "batch": 8},
        ("OscillatingLoss",),
        "SGD lr 0.5, momentum 0.9, batch 8",
    ),
    Fault(
        "overfit",
        "digits-mlp",
        {"n_train": 40, "hidden": (256, 256), "lr": 0.003},
        ("Overfit", "Overtraining"),
        "40 training samples, 256x256 MLP",
    ),
    Fault(
        "class-imbalance",
        "circles-relu",
        {"minority_ratio": 20.0},
        ("ClassImbalance",),
        "class 1 subsampled to 1:20",
    ),
    Fault(
        "class-imbalance",
        "digits-cnn",
        {"minority_ratio": 20.0},
        ("ClassImbalance",),
        "class 1 subsampled to 1:20 of each other class",
    ),
    Fault(
        "confused-labels",
        "digits-cnn",
        {"confuse": (3, 8, 0.5)},
        ("Confusion",),
        "half of class 3 labelled 8",
    ),
)
