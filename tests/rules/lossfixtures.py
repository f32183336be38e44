"""Deterministic loss curves for the loss rules: healthy shapes and the faults they must catch.

Each job has a TRAIN loss every training step and, every ``eval_every`` training steps, an
evaluation of ``eval_batches`` EVAL steps (their own global steps, as the PyTorch hook writes
them). Noise is multiplicative and seeded, so each curve is the same on every run.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from rulejobs import M, header
from trainguard.rules.base import StepData

#: healthy shapes: no loss rule may fire on any of them (at the rules' defaults)
HEALTHY = (
    "fast_to_zero",
    "slow_noisy",
    "warmup",
    "cosine_restarts",
    "gan",
    "converged_plateau",
    "near_zero_gap",
    "gru_eval",
)
#: faults: (shape, the training step the fault starts)
FAULTS = {"stall_from_start": 0, "lr_cut": 600, "overfit": 700, "oscillating": 300, "diverging": 500}


def build(
    train: Callable[[int], float],
    steps: int,
    *,
    val: Callable[[int], float] | None = None,
    eval_every: int = 100,
    eval_batches: int = 4,
    batch_noise: float = 0.02,
    seed: int = 0,
) -> list[StepData]:
    """The job's steps: ``train(t)`` per training step, ``val(t)`` per evaluation (after step t)."""
    rng = np.random.default_rng(seed + 1000)
    out: list[StepData] = []
    g = e = 0
    for t in range(steps):
        out.append(StepData.from_headers([header(g, {"TRAIN": M(t, {"loss": train(t)})})]))
        g += 1
        if val is not None and t % eval_every == eval_every - 1:
            level = val(t)
            for _ in range(eval_batches):  # a fixed validation set: batches differ, passes do not
                v = level * (1 + batch_noise * rng.normal())
                out.append(StepData.from_headers([header(g, {"EVAL": M(e, {"loss": v})})]))
                g, e = g + 1, e + 1
    return out


def _noise(seed: int, n: int, sd: float) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, sd, n)


def healthy_job(shape: str, seed: int = 0) -> list[StepData]:
    n = 2000
    z = _noise(seed, n + 1, 1.0)
    if shape == "fast_to_zero":  # memorises its data: near zero by step 100, heavy-tailed batches
        return build(
            lambda t: 2.3 * math.exp(-t / 15) + 2e-3 * math.exp(0.8 * z[t]),
            n,
            val=lambda t: 0.05 + 0.01 * math.exp(-t / 300),
            seed=seed,
        )
    if shape == "slow_noisy":  # 10% mini-batch noise on a slow power-law decline
        return build(
            lambda t: 2.0 / (1 + t / 500) * (1 + 0.10 * z[t]),
            n,
            val=lambda t: 2.1 / (1 + t / 500),
            seed=seed,
        )
    if shape == "warmup":  # 100 steps of learning-rate warm-up: flat, then falling
        curve = [
            2.3 - 0.3 * (t / 100) ** 2 if t < 100 else 2.0 * math.exp(-(t - 100) / 400) + 0.3
            for t in range(n)
        ]
        return build(lambda t: curve[t] * (1 + 0.05 * z[t]), n, val=lambda t: 1.05 * curve[t], seed=seed)
    if shape == "cosine_restarts":  # SGDR: every 500 steps the loss goes back up 2-3x

        def cosine(t: int) -> float:
            cycle, phase = divmod(t, 500)
            floor = 0.3 + 0.5 * math.exp(-cycle)
            return floor * (1 + 1.5 * (1 + math.cos(math.pi * phase / 500)) / 2)

        return build(lambda t: cosine(t) * (1 + 0.05 * z[t]), n, val=lambda t: 1.1 * cosine(t), seed=seed)
    if shape == "gan":  # D and G losses (their mean): both ln 2 at first, G rises, then they wander
        wander = np.cumsum(_noise(seed + 1, n + 1, 0.01))
        wander = wander - np.convolve(wander, np.ones(200) / 200, mode="same")  # mean-reverting

        def gan(t: int) -> float:
            d_loss = 0.69 - 0.3 * (1 - math.exp(-t / 80)) + 0.1 * math.tanh(wander[t] * 5)
            g_loss = 0.69 + 1.6 * (1 - math.exp(-t / 80)) + 0.6 * math.tanh(-wander[t] * 5)
            return (d_loss + g_loss) / 2

        return build(lambda t: gan(t) * (1 + 0.15 * z[t]), n, seed=seed)
    if shape == "converged_plateau":  # at its floor by step 300; batches 0.08-0.13 ("0.1255 vs 0.0839")
        return build(
            lambda t: (2.0 * math.exp(-t / 60) + 0.1) * (1 + 0.2 * z[t]),
            n,
            val=lambda t: 2.0 * math.exp(-t / 60) + 0.12,
            seed=seed,
        )
    if shape == "near_zero_gap":  # train near zero, validation 0.144 vs 0.065: a healthy, stable gap
        return build(
            lambda t: (1.5 * math.exp(-t / 100) + 0.065) * (1 + 0.1 * z[t]),
            n,
            val=lambda t: 1.5 * math.exp(-t / 100) + 0.144,
            seed=seed,
        )
    if shape == "gru_eval":  # char-level GRU: EVAL 0.708 vs 0.703 once converged, evaluated every 50
        return build(
            lambda t: (2.3 * math.exp(-t / 150) + 0.68) * (1 + 0.04 * z[t]),
            n,
            val=lambda t: 2.3 * math.exp(-t / 150) + 0.705 + 0.003 * math.sin(t / 170),
            eval_every=50,
            seed=seed,
        )
    raise ValueError(shape)


def fault_job(fault: str, seed: int = 0) -> list[StepData]:
    n = 2000
    z = _noise(seed, n + 1, 1.0)
    start = FAULTS[fault]
    if fault == "stall_from_start":  # learning rate 0 (or a frozen model): noise around the start
        return build(lambda t: 2.3 * (1 + 0.05 * z[t]), n, val=lambda t: 2.35, seed=seed)
    if fault == "lr_cut":  # the learning rate cut 1e6-fold mid-decline: flat from then on

        def cut(t: int) -> float:
            return 2.0 * math.exp(-min(t, start) / 1000) + 0.3

        return build(lambda t: cut(t) * (1 + 0.05 * z[t]), n, val=lambda t: 1.05 * cut(t), seed=seed)
    if fault == "overfit":  # train keeps falling, validation turns up and the gap keeps growing

        def val(t: int) -> float:
            return 1.5 * math.exp(-t / 200) + 0.3 + (0.0006 * (t - start) if t > start else 0.0)

        return build(
            lambda t: (1.5 * math.exp(-t / 200) + 0.2 * math.exp(-t / 2000)) * (1 + 0.05 * z[t]),
            n,
            val=val,
            seed=seed,
        )
    if fault == "oscillating":  # learning rate too high: the loss bounces by half its level

        def osc(t: int) -> float:
            base = 1.0 / (1 + t / 1000)
            return base * (1 + (0.5 * math.sin(2 * math.pi * t / 40) if t >= start else 0.0))

        return build(lambda t: osc(t) * (1 + 0.05 * z[t]), n, val=lambda t: osc(t), seed=seed)
    if fault == "diverging":  # the learning rate x1e4: 2.9 -> 1.4e5 -> ... (finite)

        def div(t: int) -> float:
            return 2.9 * math.exp(-t / 400) if t < start else 1.4e5 * 10.0 ** min(t - start, 30)

        return build(lambda t: div(t) * (1 + 0.03 * z[t]), n, val=lambda t: div(t), seed=seed)
    raise ValueError(fault)
