"""``Hook.cost()``: the hook's own time, measured in the training process."""

from __future__ import annotations

import sys
import time

import torch
import trainguard
from torch import nn
from trainguard import SaveConfig


def test_cost_counts_time_inside_the_hook_and_its_threads(tmp_path):
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    loss_fn = nn.CrossEntropyLoss()
    hook = trainguard.Hook(
        str(tmp_path / "job"), save_config=SaveConfig(save_interval=1), stop_check_interval_s=0
    )
    hook.register_module(model)
    hook.register_loss(loss_fn)
    before = hook.cost().training_thread_s  # register_* are entry points too
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    started = time.perf_counter()
    for _ in range(20):
        loss_fn(model(x), y).backward()
    hook.save_scalar("accuracy", 0.5)  # a user's call is an entry point too
    wall = time.perf_counter() - started
    hook.flush()
    cost = hook.cost()
    # nested entry points (a callback that records) are timed once: never more than the loop
    assert 0.0 < cost.training_thread_s - before < wall
    if sys.platform.startswith("linux"):
        assert cost.background_measured and cost.background_cpu_s > 0.0  # the writer encoded 20 steps
    hook.close()
    after = hook.cost()
    assert after.training_thread_s >= cost.training_thread_s
    assert after.background_cpu_s >= cost.background_cpu_s  # kept after the threads end
