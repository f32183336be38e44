"""A Keras 3 ``fit`` with trainguard's callback: a small classifier on synthetic blobs.

    trainguard local -- python examples/keras_train.py                 # a healthy run
    trainguard local -- python examples/keras_train.py --fault lr      # an absurd learning rate
    KERAS_BACKEND=jax python examples/keras_train.py --out runs/keras-jax

Any Keras backend works; this example defaults to ``KERAS_BACKEND=torch`` (set the variable
to choose another). With ``--fault lr`` the learning rate jumps to 1e9 at step 20, as a
schedule gone wrong would: the loss overflows, ExplodingTensor fires, and its StopTraining
action sets ``model.stop_training``; Keras ends the epoch, validates and ModelCheckpoint saves.

``pip install "trainguard[keras]"`` (plus the backend: torch, jax or tensorflow).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import numpy as np
from trainguard.integrations.keras import TrainguardCallback

RULES = [
    {
        "RuleConfigurationName": "ExplodingTensor",
        "RuleParameters": {"rule_to_invoke": "ExplodingTensor"},
        "Actions": ["Email", "SMS", "StopTraining"],
    },
    # reads gradients: the torch backend keeps them (see trainguard.integrations.keras)
    {"RuleConfigurationName": "VanishingGradient", "RuleParameters": {"rule_to_invoke": "VanishingGradient"}},
]


def blobs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    x = rng.normal(size=(n, 16)).astype("float32") + 2.0 * np.eye(16, dtype="float32")[y]
    return x, y


class LearningRateFault(keras.callbacks.Callback):
    """From ``step`` on, an absurd learning rate; and a little sleep per step for the timeline."""

    def __init__(self, step: int | None, pace: float) -> None:
        super().__init__()
        self.step, self.pace, self.batches = step, pace, 0

    def on_train_batch_begin(self, batch, logs=None):
        self.batches += 1
        if self.step is not None and self.batches == self.step + 1:
            self.model.optimizer.learning_rate.assign(1e9)
        time.sleep(self.pace)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=os.environ.get("TRAINGUARD_OUT_DIR", "runs/keras-demo"))
    parser.add_argument("--fault", choices=("none", "lr"), default="none")
    parser.add_argument("--fault-step", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--pace", type=float, default=0.02, help="seconds of sleep per step")
    parser.add_argument("--checkpoints", default="runs/keras-demo-checkpoints")
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(4),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    os.makedirs(args.checkpoints, exist_ok=True)
    checkpoint = os.path.join(args.checkpoints, "epoch-{epoch}.weights.h5")
    callback = TrainguardCallback(out_dir=args.out, rules=RULES, stop_check_interval_s=1.0)
    fault = LearningRateFault(args.fault_step if args.fault == "lr" else None, args.pace)
    print(f"training a Keras classifier on {keras.backend.backend()} (fault={args.fault}); "
          f"trainguard writes to {args.out}", flush=True)  # fmt: skip
    model.fit(
        *blobs(4096, 0),
        batch_size=64,
        epochs=args.epochs,
        validation_data=blobs(512, 1),
        callbacks=[fault, callback, keras.callbacks.ModelCheckpoint(checkpoint, save_weights_only=True)],
        verbose=0,
    )
    if callback.stopped_at_step is not None:
        saved = sorted(os.listdir(args.checkpoints))
        print(
            f"trainguard stopped training at step {callback.stopped_at_step} ({callback.stop_reason}); "
            f"checkpoints: {', '.join(saved) or 'none'}",
            flush=True,
        )
    else:
        print(f"finished {args.epochs} epochs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
