"""Synthetic jobs written straight in the step format (no framework), for tests and benchmarks.

Each object is exactly what the hook would write for the same values; the hook's own
tests prove that equivalence for real training loops.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainguard.format import documents as d
from trainguard.format.layout import MANIFEST, end_key, step_key


@dataclass
class SyntheticJob:
    job: str
    world_size: int = 1
    steps: Sequence[int] = tuple(range(0, 50, 5))
    #: (step, worker) -> train loss
    loss: Callable[[int, int], float] = lambda step, worker: 1.0 / (1 + step)
    #: (step, worker) -> eval loss, or None for no EVAL data at that step
    eval_loss: Callable[[int, int], float | None] = lambda step, worker: None
    #: (step, worker) -> mean |gradient| of the one weight tensor
    grad_mean_abs: Callable[[int, int], float] = lambda step, worker: 1e-2
    #: steps at which a gradient holds NaN
    nan_steps: frozenset[int] = frozenset()
    #: worker -> steps it does not write (it saves less often than the others)
    skipped: dict[int, set[int]] = field(default_factory=dict)
    rules: list[dict[str, Any]] | None = None
    #: layers x units: per-unit activity of relu outputs (fraction active)
    relu_units: int = 32
    dead_fraction: float = 0.0
    ended: bool = True
    sagemaker_name: str | None = None
    allow_sagemaker_stop: bool = False
    #: extra weight tensors per step (a "large model" has many)
    layers: int = 1
    #: jobs allowed to compare themselves with this one (the manifest's allow_comparison_from)
    allow_comparison_from: list[str] = field(default_factory=list)

    def objects(self) -> dict[str, bytes]:
        """Relative key → bytes for every object of the job."""
        now = time.time()
        out: dict[str, bytes] = {}
        manifest = d.Manifest(
            job=self.job,
            created=now,
            hook_version="synthetic",
            world_size=self.world_size,
            rules=self.rules,
            sagemaker_training_job_name=self.sagemaker_name,
            allow_sagemaker_stop=self.allow_sagemaker_stop,
            allow_comparison_from=self.allow_comparison_from,
        )
        out[MANIFEST] = d.dump_document(manifest)
        for worker in range(self.world_size):
            prev: int | None = None
            for step in self.steps:
                if step in self.skipped.get(worker, set()):
                    continue
                out[step_key(step, worker)] = d.encode_step(self.header(step, worker, prev, now), {})
                prev = step
            if self.ended:
                marker = d.EndMarker(
                    job=self.job, worker=worker, world_size=self.world_size, last_step=prev, wall_time=now
                )
                out[end_key(worker)] = d.dump_document(marker)
        return out

    def header(self, step: int, worker: int, prev: int | None, now: float) -> d.StepHeader:
        modes: dict[Any, d.ModeRecord] = {
            "TRAIN": d.ModeRecord(
                mode_step=step,
                scalars={"loss": d.ScalarRecord(value=self.loss(step, worker), collections=["losses"])},
                tensors=self._tensors(step, worker),
            )
        }
        eval_loss = self.eval_loss(step, worker)
        if eval_loss is not None:
            modes["EVAL"] = d.ModeRecord(
                mode_step=step, scalars={"loss": d.ScalarRecord(value=eval_loss, collections=["losses"])}
            )
        return d.StepHeader(
            job=self.job,
            step=step,
            worker=worker,
            world_size=self.world_size,
            prev_step=prev,
            wall_time=now + step * 0.01,
            modes=modes,
        )

    def _tensors(self, step: int, worker: int) -> dict[str, d.TensorRecord]:
        g = self.grad_mean_abs(step, worker)
        nan = 1 if step in self.nan_steps else 0
        tensors: dict[str, d.TensorRecord] = {}
        for layer in range(self.layers):
            tensors[f"layer{layer}.weight_grad"] = d.TensorRecord(
                collections=["gradients"],
                dtype="float32",
                shape=[64, 64],
                stats=_stats(g, nan, 4096),
            )
            tensors[f"layer{layer}.weight"] = d.TensorRecord(
                collections=["weights"],
                dtype="float32",
                shape=[64, 64],
                stats=_stats(0.05, 0, 4096),
            )
        units = self.relu_units
        dead = int(units * self.dead_fraction)
        activity = [0.0] * dead + [0.5] * (units - dead)
        tensors["relu0_output"] = d.TensorRecord(
            collections=["relu_output"],
            dtype="float32",
            shape=[32, units],
            stats=_stats(0.3, 0, 32 * units).model_copy(update={"unit_active": activity, "samples": 32}),
        )
        return tensors


def _stats(mean_abs: float, nan: int, numel: int) -> d.TensorStats:
    value = math.nan if nan else mean_abs
    return d.TensorStats(
        numel=numel,
        mean=0.0 if not nan else math.nan,
        std=value,
        min=-value,
        max=value,
        mean_abs=value,
        l1=value * numel,
        l2=value * math.sqrt(numel),
        zeros=0,
        nan=nan,
        inf=0,
        percentiles={"5": -value, "50": 0.0, "95": value},
    )


def noisy_decreasing(seed: int = 0) -> Callable[[int, int], float]:
    rng = np.random.default_rng(seed)
    noise = rng.normal(0, 0.002, 100_000)
    return lambda step, worker: float(2.0 * math.exp(-step / 40) + 0.05 + noise[step % len(noise)])
