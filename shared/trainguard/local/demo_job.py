"""The demo's training job: a small CPU PyTorch MLP, optionally with an injected fault.

Run by ``trainguard demo`` in its own process, against the local cloud it was given
through the environment (AWS_ENDPOINT_URL, TRAINGUARD_OUT_DIR), exactly as a user's job would.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

FAULTS = ("none", "exploding", "slow-loader", "dead-relu", "flat-loss")

DEMO_RULES = [
    {
        "RuleConfigurationName": "ExplodingTensor",
        "RuleParameters": {"rule_to_invoke": "ExplodingTensor"},
        "Actions": ["Email", "SMS", "StopTraining"],
    },
    {
        "RuleConfigurationName": "LossNotDecreasing",
        "RuleParameters": {"rule_to_invoke": "LossNotDecreasing", "num_steps": "10"},
        "Actions": ["Email", "SMS"],
    },
    {
        "RuleConfigurationName": "DeadRelu",
        "RuleParameters": {"rule_to_invoke": "DeadRelu"},
        "Actions": ["Email", "SMS", "StopTraining"],
    },
    {"RuleConfigurationName": "VanishingGradient", "RuleParameters": {"rule_to_invoke": "VanishingGradient"}},
    {"RuleConfigurationName": "Overfit", "RuleParameters": {"rule_to_invoke": "Overfit"}},
    # profiler rules read the system monitor's batches (step timings, CPU, memory...)
    {
        "RuleConfigurationName": "StepOutlier",
        "RuleParameters": {"rule_to_invoke": "StepOutlier"},
        "Actions": ["Email", "SMS"],
    },
]


def batches(x: Any, y: Any, stall_from: int | None) -> Any:
    """The data loader. With a fault, from ``stall_from`` on it stalls every 7th batch.

    (7, not 10: the evaluation every 10th step would take some of the stalls.)
    """
    step = 0
    while True:
        if stall_from is not None and step >= stall_from and step % 7 == 0:
            time.sleep(0.6)  # a remote dataset hiccups, a cache is evicted...
        yield x, y
        step += 1


def rings(n: int, seed: int) -> tuple[Any, Any]:  # two noisy concentric rings, as sklearn's make_circles
    import torch

    g = torch.Generator().manual_seed(seed)
    label = torch.randint(0, 2, (n,), generator=g)
    angle = torch.rand(n, generator=g) * 2 * math.pi
    radius = torch.where(label == 1, 0.5, 1.0) + 0.2 * torch.randn(
        n, generator=g
    )  # overlapping: loss plateaus
    x = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=1)
    return x, label


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", choices=FAULTS, default="none")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--fault-step", type=int, default=40, help="when the exploding fault starts")
    parser.add_argument(
        "--pace", type=float, default=0.03, help="seconds per step, so the timeline is readable"
    )
    args = parser.parse_args(argv)

    import torch
    from torch import nn

    import trainguard
    from trainguard import modes

    torch.manual_seed(0)
    out_dir = os.environ["TRAINGUARD_OUT_DIR"]
    model = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    lr = 0.2
    if args.fault == "dead-relu":
        with torch.no_grad():
            for layer in (model[0], model[2]):
                layer.bias.fill_(-50.0)  # type: ignore[operator]
    elif args.fault == "flat-loss":
        lr = 1e-9
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    x, y = rings(2000, seed=1)
    x_val, y_val = rings(2000, seed=2)

    hook = trainguard.Hook(
        out_dir, rules=DEMO_RULES, stop_check_interval_s=0.25, profiler=0.5, profiler_flush_s=2.0
    )
    hook.register_module(model)
    hook.register_loss(loss_fn)
    print(f"training {hook.job_name}: fault={args.fault}, lr={lr}, writing to {out_dir}", flush=True)
    step = 0
    loader = hook.timed_loader(batches(x, y, 100 if args.fault == "slow-loader" else None))
    try:
        for step, (inputs, labels) in zip(range(args.steps), loader, strict=False):  # the loader is endless
            hook.set_mode(modes.TRAIN)
            if args.fault == "exploding" and step == args.fault_step:
                for group in optimizer.param_groups:
                    group["lr"] = 1e4  # a learning-rate schedule gone wrong
            loss = loss_fn(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 10 == 9:
                hook.set_mode(modes.EVAL)
                with torch.no_grad():
                    loss_fn(model(x_val), y_val)
            if step % 20 == 0:
                print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
            time.sleep(args.pace)
    except trainguard.StopTrainingRequested as stop:
        print(
            f"step {step:4d}  trainguard asked this job to stop ({stop}); checkpointing and exiting",
            flush=True,
        )
        hook.close()
        return 0
    finally:
        hook.close()
    print(f"finished {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
