"""A framework-free training loop (numpy linear regression) with the trainguard hook.

    python examples/numpy_loop.py runs/numpy-demo           # local folder
    python examples/numpy_loop.py s3://my-bucket/jobs/numpy-demo

Shows the *polling* style of cooperative stop: ``raise_on_stop=False`` and a check of
``hook.should_stop`` at the top of each step, so the loop can checkpoint and exit.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import trainguard
from trainguard import Collection, SaveConfig, modes


def main(out_dir: str, steps: int = 200) -> int:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype(np.float32)
    true_w = rng.normal(size=(8, 1)).astype(np.float32)
    y = x @ true_w + 0.01 * rng.normal(size=(512, 1)).astype(np.float32)
    w = np.zeros((8, 1), np.float32)
    rules = [
        {
            "RuleConfigurationName": "LossNotDecreasing",
            "RuleParameters": {"rule_to_invoke": "LossNotDecreasing"},
            "Actions": ["Email", "StopTraining"],
        },
        {
            "RuleConfigurationName": "VanishingGradient",
            "RuleParameters": {"rule_to_invoke": "VanishingGradient"},
        },
    ]
    hook = trainguard.Hook(
        out_dir,
        include_collections=["losses", "weights", "gradients"],
        # statistics of weights and gradients at every save; full weights every 50 steps
        collections=[Collection("weights", SaveConfig(save_interval=50), save_full=True)],
        rules=rules,
        raise_on_stop=False,
    )
    with hook:
        for step in range(steps):
            if hook.should_stop:  # a rule with the StopTraining action fired
                np.save("checkpoint.npy", w)
                print(f"step {step}: stop requested ({hook.stop_signal}); checkpointed and exiting")
                return 0
            batch = rng.integers(0, len(x), 64)
            err = x[batch] @ w - y[batch]
            loss = float((err**2).mean())
            grad = 2 * x[batch].T @ err / len(batch)
            hook.save_scalar("mse", loss, step=step, collections=["losses"])
            # explicit saves are always written (save configs throttle only what the hook
            # captures itself); full=False: statistics only, the full weights come every 50
            hook.save_tensor("w", w, step=step, collections=["weights"], full=False)
            hook.save_tensor("gradient/w", grad, step=step, collections=["gradients"], full=False)
            w -= 0.05 * grad
            if step % 50 == 49:  # evaluation, recorded in the same step object under EVAL
                hook.set_mode(modes.EVAL)
                hook.save_scalar("mse", float(((x @ w - y) ** 2).mean()), step=step, collections=["losses"])
                hook.set_mode(modes.TRAIN)
    print(f"finished {steps} steps; final loss {loss:.5f}; written to {out_dir}")
    return 0


if __name__ == "__main__":
    # `trainguard local -- python examples/numpy_loop.py` sets TRAINGUARD_OUT_DIR to its local S3
    sys.exit(
        main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TRAINGUARD_OUT_DIR", "runs/numpy-demo"))
    )
