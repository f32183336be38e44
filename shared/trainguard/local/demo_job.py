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
        # 10-step blocks (one evaluation each): the demo's 120 steps hold the 4 blocks of a stall
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


#: the rule each fault is for (the demo checks that this rule, not just any, found it)
FAULT_RULES = {
    "exploding": "ExplodingTensor",
    "dead-relu": "DeadRelu",
    "flat-loss": "LossNotDecreasing",
    "slow-loader": "StepOutlier",
}


def rule_config(name: str) -> dict[str, Any]:
    return next(r for r in DEMO_RULES if r["RuleConfigurationName"] == name)


#: close() waits this long at most for the uploads (a safety net: seconds on a quiet machine)
CLOSE_WAIT_S = 300.0
#: the demo never gets further than this many objects ahead of the local cloud
MAX_BACKLOG = 32


def keep_pace(hook: Any, max_backlog: int = MAX_BACKLOG, give_up_s: float = 60.0) -> None:
    """Wait while the hook has more than ``max_backlog`` objects not yet delivered.

    The local cloud runs in one process beside the job; on a crowded machine it takes
    objects more slowly than even this small job writes them, and a job that races ahead
    fills the hook's queue and loses steps. A real job against S3 never needs this. After
    one wait of ``give_up_s`` the cloud is not taking objects at all: stop waiting (and say so).
    """
    global _pacing
    if not _pacing:
        return
    deadline = time.monotonic() + give_up_s
    stats = hook.upload_stats
    while stats.submitted - stats.written - stats.dropped > max_backlog:
        if time.monotonic() > deadline:
            _pacing = False
            print(
                f"the local cloud took no object for {give_up_s:.0f} s; not waiting for it any more",
                flush=True,
            )
            return
        time.sleep(0.02)


_pacing = True


def clean_twin_steps(steps: int) -> int:
    """The clean twin's length: at most StepOutlier's warm-up plus ``n_outliers`` TRAIN steps.

    StepOutlier judges a step against the steps before it; when the machine gets busier
    mid-run (another job starts), every later step looks slow. A clean twin that StepOutlier
    judges on at most ``n_outliers`` steps cannot fire on load alone (it needs more outliers
    than that), so its NoIssuesFound is about the job, not about the machine.
    """
    from trainguard.rules.profiler.step_outlier import WARMUP_STEPS, StepOutlier

    params = {k: v for k, v in rule_config("StepOutlier")["RuleParameters"].items() if k != "rule_to_invoke"}
    config = StepOutlier.Config.model_validate(params)
    # TRAIN steps: the loop's steps (its EVAL passes are steps of their own mode)
    return min(steps, WARMUP_STEPS + config.n_outliers)


def stops(fault: str) -> bool:
    """Whether the rule that catches ``fault`` stops the job (StopTraining in its actions)."""
    rule = FAULT_RULES.get(fault)
    return rule is not None and "StopTraining" in rule_config(rule).get("Actions", [])


class StepClock:
    """The loop's own timing of its steps, as StepOutlier sees them.

    A step runs from one forward of the model to the next (the hook's step boundary); the
    running mean and variance are over every TRAIN step so far, stalls included, exactly the
    statistics the rule judges the next step against.
    """

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.mode: str | None = None
        self.started = 0.0

    def forward(self, mode: str) -> None:
        """Call right before each forward of the model, with its mode."""
        now = time.perf_counter()
        if self.mode == "TRAIN":
            d = now - self.started
            self.n += 1
            delta = d - self.mean
            self.mean += delta / self.n
            self.m2 += delta * (d - self.mean)
        self.mode, self.started = mode, now

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / (self.n - 1)) if self.n > 1 else 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


class StallingLoader:
    """The data loader: endless batches; with a fault, some of them stall.

    The stalls are sized from the step times this machine gives right now, not fixed: a
    stalled step must last longer than StepOutlier's limit (mean + ``stddev`` · std of the
    TRAIN steps before it, earlier stalls included), with a margin, or a busy machine hides
    the fault in its noise (at p50 0.37 s / p95 1.31 s per step, a fixed 0.6 s stall did).
    ``count`` stalls, one every ``every`` batches once ``warmup`` TRAIN steps have passed
    (the rule judges none before), each only while a TRAIN step is running so it lands in
    one; sparse enough that the stalls themselves do not lift the limit out of reach.
    """

    def __init__(
        self,
        x: Any,
        y: Any,
        clock: StepClock,
        *,
        enabled: bool,
        warmup: int,
        stddev: float,
        count: int,
        every: int = 12,
        min_stall_s: float = 0.6,
    ) -> None:
        self.x, self.y, self.clock = x, y, clock
        self.enabled, self.warmup, self.stddev = enabled, warmup, stddev
        self.count, self.every, self.min_stall_s = count, every, min_stall_s
        self.stalls: list[float] = []

    def stall_for(self) -> float:
        """How long this batch stalls: past the rule's current limit by a margin."""
        clock = self.clock
        limit = clock.mean + self.stddev * clock.std
        margin = max(0.25, 0.5 * clock.std, 0.1 * limit)
        return max(self.min_stall_s, limit + margin - clock.elapsed())

    def __iter__(self) -> Any:
        due_at = None
        while True:
            clock = self.clock
            if self.enabled and len(self.stalls) < self.count and clock.n >= self.warmup + 5:
                due_at = clock.n if due_at is None else due_at
                if clock.n >= due_at and clock.mode == "TRAIN":
                    seconds = self.stall_for()
                    time.sleep(seconds)  # a remote dataset hiccups, a cache is evicted...
                    self.stalls.append(seconds)
                    due_at = clock.n + self.every
            yield self.x, self.y


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
    parser.add_argument(
        "--stop-wait-s",
        type=float,
        default=300.0,
        help="with a fault whose rule stops the job, wait this long at most after --steps for the stop "
        "(the outcome must not depend on how fast the machine evaluates)",
    )
    args = parser.parse_args(argv)

    started = time.monotonic()
    print("importing PyTorch…", flush=True)  # seconds on a quiet machine, tens on a busy one
    import torch
    from torch import nn

    import trainguard
    from trainguard import modes
    from trainguard.rules.profiler.step_outlier import WARMUP_STEPS, StepOutlier

    print(f"PyTorch {torch.__version__} imported in {time.monotonic() - started:.1f} s", flush=True)
    torch.set_num_threads(1)  # a tiny model: one thread, so a busy machine slows it least
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
    elif args.fault == "slow-loader":
        lr = 0.05  # its run is longer: at 0.2 the loss would plateau (and LossNotDecreasing rightly fire)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    x, y = rings(2000, seed=1)
    x_val, y_val = rings(2000, seed=2)

    print("starting the trainguard hook (boto3, the job manifest, the system monitor)…", flush=True)
    hook = trainguard.Hook(
        out_dir,
        rules=DEMO_RULES,
        stop_check_interval_s=0.25,
        profiler=0.5,
        profiler_flush_s=2.0,
        # on a crowded machine the local cloud takes objects slowly: close() waits for them all
        flush_timeout_s=CLOSE_WAIT_S,
    )
    hook.register_module(model)
    hook.register_loss(loss_fn)
    print(f"training {hook.job_name}: fault={args.fault}, lr={lr}, writing to {out_dir}", flush=True)
    params = {k: v for k, v in rule_config("StepOutlier")["RuleParameters"].items() if k != "rule_to_invoke"}
    outlier = StepOutlier.Config.model_validate(params)
    clock = StepClock()
    stalling = StallingLoader(
        x,
        y,
        clock,
        enabled=args.fault == "slow-loader",
        warmup=WARMUP_STEPS,
        stddev=outlier.stddev,
        count=outlier.n_outliers + 3,  # the rule fires after more than n_outliers
    )
    step = 0
    try:
        for step, (inputs, labels) in enumerate(hook.timed_loader(stalling)):  # the loader is endless
            if step >= args.steps:
                break
            keep_pace(hook)
            hook.set_mode(modes.TRAIN)
            if args.fault == "exploding" and step == args.fault_step:
                for group in optimizer.param_groups:
                    group["lr"] = 1e4  # a learning-rate schedule gone wrong
            clock.forward("TRAIN")
            loss = loss_fn(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 10 == 9:
                hook.set_mode(modes.EVAL)
                with torch.no_grad():
                    clock.forward("EVAL")
                    loss_fn(model(x_val), y_val)
            if step % 20 == 0:
                print(f"step {step:4d}  (global step {hook.step})  loss {loss.item():.4f}", flush=True)
            time.sleep(args.pace)
        if stops(args.fault) and not hook.should_stop:
            # a real job would train on; this one waits, writing nothing more, so that the stop
            # arrives however far behind a busy machine's evaluation is
            print(
                f"step {step:4d}  the planned steps are done; waiting up to {args.stop_wait_s:.0f} s "
                "for trainguard's verdict",
                flush=True,
            )
            deadline = time.monotonic() + args.stop_wait_s
            while not hook.should_stop and time.monotonic() < deadline:
                time.sleep(0.25)
        if hook.should_stop:
            raise trainguard.StopTrainingRequested(hook.stop_signal)
    except trainguard.StopTrainingRequested as stop:
        print(
            f"step {step:4d}  (global step {hook.step})  trainguard asked this job to stop ({stop}); "
            "checkpointing and exiting",
            flush=True,
        )
        return 0
    finally:
        hook.close()
        if stalling.stalls:
            sizes = ", ".join(f"{s:.2f}" for s in stalling.stalls)
            print(
                f"the data loader stalled {len(stalling.stalls)} times ({sizes} s), sized from this "
                f"machine's TRAIN step times (mean {clock.mean:.3f} s, std {clock.std:.3f} s)",
                flush=True,
            )
    print(f"finished {step} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
