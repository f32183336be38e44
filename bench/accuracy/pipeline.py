"""The input pipeline of a run (sampling, normalisation, tokenisation) with its fault switches.

Every draw from the sampler's generator happens the same way whether or not a fault is on,
until a fault changes *what* is drawn, so a faulty run equals its clean twin up to the onset.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from bench.accuracy.tasks import CLASSES, PAD, SEQ_MAX, Dataset


@dataclass
class Switches:
    """What the faults have changed so far (read by the pipeline and the training loop)."""

    lr_scale: float = 1.0
    batch: int | None = None
    #: "mild" | "medium" | "raw": how far the pipeline stops normalising
    unnormalized: str | None = None
    corrupt: str | None = None  # outlier | nan | inf
    corrupt_every: int = 0
    corrupt_done: bool = False
    subset: np.ndarray | None = None
    class_weights: np.ndarray | None = None
    confuse_share: float = 0.0
    shuffle_share: float = 0.0
    truncate: int | None = None
    pad_to: int | None = None
    weight_keep: float = 1.0
    extra: dict[str, object] = field(default_factory=dict)


class Pipeline:
    def __init__(self, data: Dataset, seed: int, batch: int) -> None:
        self.data = data
        self.family = data.family
        self.batch = batch
        self.rng = np.random.default_rng(20_000 + seed)
        self.fault_rng = np.random.default_rng(30_000 + seed)
        x = data.train.x
        if self.family == "tabular":
            self.mean = x.mean(0, keepdims=True)
            self.std = x.std(0, keepdims=True)
        elif self.family in ("cnn", "resnet"):
            scaled = x.astype(np.float32) / 255.0
            self.mean = scaled.mean((0, 2, 3), keepdims=True)
            self.std = scaled.std((0, 2, 3), keepdims=True)
        self.by_class = [np.flatnonzero(data.train.y == c) for c in range(CLASSES)]

    # ------------------------------------------------------------------ transforms
    def transform(self, x: np.ndarray, sw: Switches) -> torch.Tensor:
        if self.family == "tabular":
            z = (x - self.mean) / self.std
            if sw.unnormalized == "mild":
                z = z * 3.0 + 1.0
            elif sw.unnormalized == "medium":
                z = z.copy()
                z[:, :4] = x[:, :4]  # four columns skip the scaler
            elif sw.unnormalized == "raw":
                z = x
            return torch.from_numpy(np.ascontiguousarray(z, dtype=np.float32))
        if self.family in ("cnn", "resnet"):
            pixels = x.astype(np.float32)
            if sw.unnormalized == "mild":
                out = pixels / 255.0  # scaled, not standardised
            elif sw.unnormalized == "medium":
                out = pixels / 32.0
            elif sw.unnormalized == "raw":
                out = pixels  # 0-255
            else:
                out = (pixels / 255.0 - self.mean) / self.std
            return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))
        tokens = x.copy()
        if sw.truncate is not None:
            tokens[:, sw.truncate :] = PAD
        if sw.pad_to is not None and sw.pad_to > tokens.shape[1]:
            tokens = np.concatenate([tokens, np.full((len(tokens), sw.pad_to - tokens.shape[1]), PAD)], 1)
        return torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))

    # ------------------------------------------------------------------ batches
    def train_batch(self, sw: Switches) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self.data.train.y)
        size = sw.batch or self.batch
        draw = self.rng.random(size)  # one draw per sample, used by every sampler below
        if sw.subset is not None:
            idx = sw.subset[(draw * len(sw.subset)).astype(np.int64)]
        elif sw.class_weights is not None:
            cls = np.searchsorted(np.cumsum(sw.class_weights / sw.class_weights.sum()), self.rng.random(size))
            cls = np.minimum(cls, CLASSES - 1)
            idx = np.array(
                [self.by_class[c][int(d * len(self.by_class[c]))] for c, d in zip(cls, draw, strict=True)]
            )
        else:
            idx = (draw * n).astype(np.int64)
        x = self.data.train.x[idx]
        y = self.data.train.y[idx].copy()
        if sw.confuse_share > 0:
            hit = (y == 1) & (self.fault_rng.random(size) < sw.confuse_share)
            y[hit] = 2
        if sw.shuffle_share > 0:
            hit = np.flatnonzero(self.fault_rng.random(size) < sw.shuffle_share)
            y[hit] = y[self.fault_rng.permutation(hit)]
        xt = self.transform(x, sw)
        if sw.corrupt is not None and xt.is_floating_point():
            due = not sw.corrupt_done if sw.corrupt_every == 0 else self._counter(sw) % sw.corrupt_every == 0
            if due:
                sw.corrupt_done = True
                value = {"nan": float("nan"), "inf": float("inf")}.get(sw.corrupt)
                flat = xt.view(len(xt), -1)
                if value is None:  # a finite outlier: one value 50 standard deviations out
                    flat[0, 0] = flat[:, 0].mean() + 50.0 * (flat[:, 0].std() + 1e-6)
                else:
                    flat[0, 0] = value
        return xt, torch.from_numpy(y)

    @staticmethod
    def _counter(sw: Switches) -> int:
        count = int(sw.extra.get("corrupt_count", 0))  # type: ignore[call-overload]
        sw.extra["corrupt_count"] = count + 1
        return count

    def val_batches(self, sw: Switches, batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        x, y = self.data.val.x, self.data.val.y
        size = -(-len(y) // batches)
        return [
            (self.transform(x[i : i + size], sw), torch.from_numpy(y[i : i + size]))
            for i in range(0, len(y), size)
        ]


def pad_share(tokens: torch.Tensor) -> float:
    return float((tokens == PAD).float().mean())


__all__ = ["SEQ_MAX", "Pipeline", "Switches", "pad_share"]
