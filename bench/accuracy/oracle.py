"""The symptom oracle: each rule's documented condition, computed from the full tensors at
every training step inside the training loop (not from the hook's sampled statistics).

A run is labelled positive for a rule when the oracle's condition holds for at least
``PERSIST[rule]`` consecutive steps; the onset is the first of those steps. Losses are the
loss of the whole training (or validation) set at the current parameters, computed by an
un-hooked copy of the model, so the labels are not the mini-batch noise the loop sees.
See docs/accuracy.md for the definitions in words.
"""

from __future__ import annotations

import math
from collections import deque

import torch

#: steps a condition must hold in a row to label a run positive (1: a single step suffices)
PERSIST: dict[str, int] = {
    "ExplodingTensor": 1,
    "VanishingGradient": 10,
    "GradientNormRatio": 10,
    "DeadRelu": 10,
    "SaturatedActivation": 10,
    "LossNotDecreasing": 10,
    "Overfit": 10,
    "Overtraining": 10,
    "PoorWeightInitialization": 1,
    "WeightUpdateRatio": 10,
    "AllZero": 10,
    "UnchangedTensor": 1,
    "ClassImbalance": 10,
    "Confusion": 10,
    "CheckInputImages": 10,
    "DataNotNormalized": 10,
    "OscillatingLoss": 5,
}

TANH_BAND = (-9.4999, 9.4999)
SIGMOID_BAND = (-23.0, 16.99999)


def _unit_fraction(mask: torch.Tensor) -> torch.Tensor:
    """Per-unit share of samples where ``mask`` holds: units are the last axis of 2-d tensors,
    the channel axis of 4-d ones (the hook's convention)."""
    m = mask.float()
    if m.dim() == 2:
        return m.mean(0)
    return m.transpose(0, 1).reshape(m.shape[1], -1).mean(1)


def _dead_share(fractions: torch.Tensor, threshold_percent: float = 1.0) -> float:
    return 100.0 * float((fractions * 100.0 < threshold_percent).float().mean())


def _finite(x: float) -> bool:
    return not (math.isnan(x) or math.isinf(x))


class Oracle:
    """Feed ``observe`` once per training step; ``onsets()`` gives the labels."""

    def __init__(self, classes: int) -> None:
        self.classes = classes
        self.hits: dict[str, list[bool]] = {name: [] for name in PERSIST}
        self.train_losses: list[float] = []
        self.val_losses: list[float] = []
        self.best_train: float | None = None
        self.stale_train = 0
        self.best_val: float | None = None
        self.stale_val = 0
        self.best_pwi: float | None = None
        self.stale_pwi = 0
        self.swings: deque[int] = deque(maxlen=50)
        self.direction = 0
        self.label_counts = torch.zeros(classes, dtype=torch.long)
        self.recent: deque[tuple[int, int]] = deque(maxlen=500)
        self.anchor: dict[str, tuple[int, torch.Tensor]] = {}
        self.step = 0

    # ------------------------------------------------------------------ per step
    def observe(
        self,
        *,
        loss: float,
        train_loss: float,
        val_loss: float,
        params_before: dict[str, torch.Tensor],
        params_after: dict[str, torch.Tensor],
        grads: dict[str, torch.Tensor],
        acts: list[tuple[str, str, torch.Tensor]],
        inputs: torch.Tensor,
        labels: torch.Tensor,
        preds: torch.Tensor,
    ) -> None:
        h: dict[str, bool] = {}
        t = self.step
        everything = [*params_before.values(), *grads.values(), *(a for _, _, a in acts), inputs]
        h["ExplodingTensor"] = (not _finite(loss)) or any(
            not bool(torch.isfinite(x).all()) for x in everything
        )

        means = [float(g.abs().mean()) for g in grads.values() if g.numel()]
        means = [m for m in means if _finite(m)]
        h["VanishingGradient"] = bool(means) and min(means) < 1e-7

        weights = [g for n, g in grads.items() if "weight" in n]
        gnr = False
        if len(weights) >= 2:
            first, last = float(weights[0].norm()), float(weights[-1].norm())
            if _finite(first) and _finite(last) and last > 0:
                ratio = first / last
                gnr = (ratio < 1e-3 and first < 1e-4) or ratio > 70.0
        h["GradientNormRatio"] = gnr

        h["DeadRelu"] = any(
            _dead_share(_unit_fraction(a > 0)) > 50.0 for kind, _, a in acts if kind == "relu_output"
        )
        sat = False
        for kind, _, a in acts:
            if kind in ("tanh_input", "sigmoid_input"):
                lo, hi = TANH_BAND if kind == "tanh_input" else SIGMOID_BAND
                sat = sat or _dead_share(_unit_fraction((a >= lo) & (a <= hi))) > 50.0
        h["SaturatedActivation"] = sat

        # losses of the whole training / validation set at the current parameters
        self.train_losses.append(train_loss)
        self.val_losses.append(val_loss)
        lnd = False
        if t >= 10:
            before = self.train_losses[t - 10]
            lnd = not (train_loss < before)
            best = min((v for v in self.train_losses[:t] if _finite(v)), default=None)
            lnd = lnd or (best is not None and train_loss > best * 1.05)
        h["LossNotDecreasing"] = lnd
        h["Overfit"] = _finite(train_loss) and train_loss > 0 and (val_loss - train_loss) / train_loss > 0.1

        # Overtraining: train loss not improved by delta=0.1 for 5 steps; validation for 10
        # evaluations (= 50 steps at one evaluation every 5 steps)
        self.best_train, self.stale_train = _patience(self.best_train, self.stale_train, train_loss, 0.1)
        self.best_val, self.stale_val = _patience(self.best_val, self.stale_val, val_loss, 0.1)
        h["Overtraining"] = self.stale_train >= 5 or self.stale_val >= 50

        # PoorWeightInitialization, first 10 steps only
        pwi = False
        if t < 10:
            variances = [float(a.var(unbiased=False)) for kind, _, a in acts if kind == "relu_input"]
            if len(variances) >= 2:
                hi, lo = max(variances), min(variances)
                pwi = (hi / lo if lo > 0 else (math.inf if hi > 0 else 1.0)) > 10.0
            for g in grads.values():
                flat = g.flatten().float()
                if flat.numel() and bool(torch.isfinite(flat).all()):
                    q = torch.quantile(flat[:: max(1, flat.numel() // 4096)], torch.tensor([0.05, 0.95]))
                    pwi = pwi or float(q[1] - q[0]) < 0.001
            if _finite(train_loss) and (self.best_pwi is None or train_loss < self.best_pwi):
                self.best_pwi, self.stale_pwi = train_loss, 0
            else:
                self.stale_pwi += 1
            pwi = pwi or self.stale_pwi >= 5
        h["PoorWeightInitialization"] = pwi

        wur = False
        for name, before_w in params_before.items():
            if name.endswith("bias"):
                continue
            ratio = float((params_after[name] - before_w).norm()) / (float(before_w.norm()) + 1e-9)
            wur = wur or ratio > 10.0 or ratio < 1e-8
        h["WeightUpdateRatio"] = wur

        h["AllZero"] = any(x.numel() and not bool((x != 0).any()) for x in everything)

        # UnchangedTensor: a parameter, gradient or activation allclose(rtol 1e-5, atol 1e-8) to
        # its value 20 steps ago and at every step since (3 saved steps at the interval of 10)
        unchanged = False
        tensors = {
            **params_before,
            **{f"gradient/{k}": g for k, g in grads.items()},
            **{f"{name}/{kind}": a for kind, name, a in acts},
        }
        for name, w in tensors.items():
            since, ref = self.anchor.get(name, (t, w))
            if ref.shape != w.shape or not torch.allclose(w, ref, rtol=1e-5, atol=1e-8, equal_nan=False):
                since, ref = t, w
            self.anchor[name] = (since, ref)
            unchanged = unchanged or t - since >= 20
        h["UnchangedTensor"] = unchanged

        # ClassImbalance: labels so far have max/min count > 10, or over the last 500 labels a
        # class is mispredicted in > 70% of its labels
        self.label_counts += torch.bincount(labels, minlength=self.classes)[: self.classes]
        seen = self.label_counts[self.label_counts > 0]
        ci = len(seen) >= 2 and float(seen.max()) / float(seen.min()) > 10.0
        self.recent.extend(zip(labels.tolist(), preds.tolist(), strict=True))
        if len(self.recent) >= 500:
            wrong: dict[int, list[int]] = {}
            for lab, pr in self.recent:
                wrong.setdefault(lab, [0, 0])
                wrong[lab][0] += 1
                wrong[lab][1] += int(lab != pr)
            ci = ci or any(w / n > 0.7 for n, w in wrong.values())
        h["ClassImbalance"] = ci

        conf = False
        present = torch.unique(labels).tolist()
        for c in present:
            row = preds[labels == c]
            if float((row == c).float().mean()) < 0.9:
                conf = True
            for d in present if not conf else []:
                if d != c and float((row == d).float().mean()) > 0.1:
                    conf = True
        h["Confusion"] = conf

        x = inputs.float()
        h["CheckInputImages"] = abs(float(x.mean())) > 0.2
        h["DataNotNormalized"] = abs(float(x.mean())) > 1.0 or float(x.std(unbiased=False)) > 10.0

        osc = False
        if len(self.train_losses) >= 2 and _finite(train_loss) and _finite(self.train_losses[-2]):
            delta = train_loss - self.train_losses[-2]
            direction = (delta > 0) - (delta < 0)
            self.swings.append(int(abs(delta) >= 0.03 and direction != 0 and direction == -self.direction))
            if direction:
                self.direction = direction
            osc = len(self.swings) >= 10 and 100.0 * sum(self.swings) / len(self.swings) >= 20.0
        h["OscillatingLoss"] = osc

        for name in PERSIST:
            self.hits[name].append(bool(h.get(name, False)))
        self.step += 1

    # ------------------------------------------------------------------ labels
    def onsets(self) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for name, hits in self.hits.items():
            need, n = PERSIST[name], len(hits)
            onset, i = None, 0
            while i < n and onset is None:
                if not hits[i]:
                    i += 1
                    continue
                j = i
                while j < n and hits[j]:
                    j += 1
                if j - i >= need:
                    onset = i
                i = j
            out[name] = onset
        return out


def _patience(best: float | None, stale: int, loss: float, delta: float) -> tuple[float | None, int]:
    if (best is None and _finite(loss)) or (best is not None and _finite(loss) and loss < best - delta):
        return loss, 0
    return best, stale + 1
