"""A PyTorch training loop with the trainguard hook (the smdebug-style API).

    python examples/torch_loop.py runs/torch-demo
    python examples/torch_loop.py s3://my-bucket/jobs/torch-demo

Shows the *exception* style of cooperative stop (the default, ``raise_on_stop=True``):
when a rule with the StopTraining action fires, the next forward of the model raises
``trainguard.StopTrainingRequested``; the loop catches it, checkpoints and exits.
"""

from __future__ import annotations

import os
import sys

import torch
import trainguard
from torch import nn
from trainguard import modes


def main(out_dir: str, steps: int = 100) -> int:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(2048, 20), torch.randint(0, 4, (2048,))
    x_val, y_val = torch.randn(512, 20), torch.randint(0, 4, (512,))

    # rules=None: the service's default rules; the hook records what they read: the losses
    # every step, gradient mean-abs and ReLU activity (statistics, not tensors) every 50 steps
    hook = trainguard.Hook(out_dir, rules=None)
    hook.register_module(model)  # each forward of `model` is a step
    hook.register_loss(loss_fn)  # its output is saved in `losses`
    step = 0
    try:
        for step in range(steps):
            hook.set_mode(modes.TRAIN)
            batch = torch.randint(0, len(x), (128,))
            optimizer.zero_grad()
            loss = loss_fn(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
            if step % 20 == 19:
                hook.set_mode(modes.EVAL)
                with torch.no_grad():
                    loss_fn(model(x_val), y_val)
    except trainguard.StopTrainingRequested as stop:
        torch.save(model.state_dict(), "checkpoint.pt")
        print(f"step {step}: {stop}; checkpointed and exiting")
        return 0
    finally:
        report = hook.close()  # writes the last segment and this worker's end marker
        if not report.ok:  # close() has already said what did not arrive, loudly
            print(f"trainguard could not deliver everything: {report.error or report.dropped}")
    print(f"finished {steps} steps; written to {out_dir}")
    return 0


if __name__ == "__main__":
    # `trainguard local -- python examples/torch_loop.py` sets TRAINGUARD_OUT_DIR to its local S3
    # (trainguard.Hook() without out_dir reads it too)
    sys.exit(
        main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TRAINGUARD_OUT_DIR", "runs/torch-demo"))
    )
