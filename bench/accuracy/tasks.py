"""Base tasks (datasets and models) and the training configuration a run is built from.

Two tasks, both generated with numpy (no scikit-learn), a few thousand samples each:

* ``circles``: two noisy concentric circles in 2-D (as ``make_circles(noise=0.1, factor=0.5)``),
  standardised; an MLP (ReLU, tanh or sigmoid hidden layers).
* ``digits``: 8x8 "digits-like" images: 10 fixed stroke prototypes (pixel values 0..16, like
  scikit-learn's digits), each sample a prototype shifted by up to one pixel plus noise;
  standardised with the dataset's mean and std; a small CNN (or an MLP).

A task's data depend on the run's seed only through sampling noise: the prototypes are fixed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one training run. A fault is a set of overrides of these fields."""

    task: str = "circles"  # circles | digits
    arch: str = "mlp"  # mlp | cnn
    act: str = "relu"  # relu | tanh | sigmoid (MLP hidden layers)
    hidden: tuple[int, ...] = (32, 32)
    optimizer: str = "adam"  # adam | sgd
    lr: float = 0.01
    momentum: float = 0.0
    steps: int = 120
    batch: int = 128
    eval_every: int = 5
    n_train: int = 1000
    n_val: int = 500
    seed: int = 0
    # --- injections (defaults: none)
    input_scale: float = 1.0  # multiply the standardised inputs (circles), or pixels 0..255 (digits: raw)
    raw_pixels: bool = False  # digits: leave pixels in 0..255 instead of standardising
    bias_init: float | None = None  # constant bias of every hidden layer
    weight_gain: float = 1.0  # multiply every initial weight
    layer_gain: tuple[tuple[int, float], ...] = ()  # (linear layer index, factor) on initial weights
    zero_init: bool = False  # every weight and bias starts at 0
    frozen: tuple[str, ...] = ()  # parameter-name prefixes with requires_grad=False
    minority_ratio: float | None = None  # keep 1/ratio of class 1 (class imbalance)
    confuse: tuple[int, int, float] | None = None  # (a, b, share): relabel share of class a as b

    def variant(self) -> str:
        """Names the clean configuration a run belongs to (its clean twin's key)."""
        if self.arch == "cnn":
            return f"{self.task}-cnn"
        depth = len(self.hidden)
        return f"{self.task}-{self.act}-mlp{depth}"

    def but(self, **changes: Any) -> RunConfig:
        return replace(self, **changes)


# ------------------------------------------------------------------------------ data
#: noise of the circles (make_circles' ``noise``): enough overlap that the loss stays well above 0
CIRCLES_NOISE = 0.15
#: pixel noise of the digits (values 0..16): enough that the loss stays well above 0
DIGITS_NOISE = 6.0


def _circles(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    n_out = n // 2
    n_in = n - n_out
    t_out = rng.uniform(0, 2 * np.pi, n_out)
    t_in = rng.uniform(0, 2 * np.pi, n_in)
    x = np.concatenate(
        [np.stack([np.cos(t_out), np.sin(t_out)], 1), 0.5 * np.stack([np.cos(t_in), np.sin(t_in)], 1)]
    )
    x = x + rng.normal(0.0, CIRCLES_NOISE, x.shape)
    y = np.concatenate([np.zeros(n_out, np.int64), np.ones(n_in, np.int64)])
    order = rng.permutation(n)
    return x[order].astype(np.float32), y[order]


def _prototypes() -> np.ndarray:
    """Ten fixed 8x8 stroke images with values 0..16 (the same for every run)."""
    rng = np.random.default_rng(12345)
    protos = np.zeros((10, 8, 8), np.float32)
    for k in range(10):
        for _ in range(3):
            r0, c0, r1, c1 = rng.integers(1, 7, 4)
            steps = max(abs(r1 - r0), abs(c1 - c0)) + 1
            rows = np.linspace(r0, r1, steps).round().astype(int)
            cols = np.linspace(c0, c1, steps).round().astype(int)
            protos[k, rows, cols] = 16.0
    return protos


_PROTOS = _prototypes()


def _digits(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, 10, n)
    x = _PROTOS[y].copy()
    shifts = rng.integers(-1, 2, (n, 2))
    for i, (dr, dc) in enumerate(shifts):
        x[i] = np.roll(x[i], (int(dr), int(dc)), axis=(0, 1))
    x = np.clip(x + rng.normal(0.0, DIGITS_NOISE, x.shape), 0.0, 16.0)
    return x.reshape(n, 1, 8, 8).astype(np.float32), y.astype(np.int64)


@dataclass
class Data:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    classes: int


def make_data(cfg: RunConfig) -> Data:
    rng = np.random.default_rng(1000 + cfg.seed)
    gen = _circles if cfg.task == "circles" else _digits
    x, y = gen(cfg.n_train + cfg.n_val, rng)
    x_tr, y_tr, x_va, y_va = x[: cfg.n_train], y[: cfg.n_train], x[cfg.n_train :], y[cfg.n_train :]
    if cfg.minority_ratio:
        # keep 1/ratio of class 1 in both splits (the validation set has the same skew)
        def skew(xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            idx1 = np.flatnonzero(ys == 1)
            n_other = int(np.sum(ys != 1))
            keep1 = idx1[: max(1, int(n_other / (cfg.minority_ratio or 1) / max(1, len(np.unique(ys)) - 1)))]
            keep = np.sort(np.concatenate([np.flatnonzero(ys != 1), keep1]))
            return xs[keep], ys[keep]

        x_tr, y_tr = skew(x_tr, y_tr)
        x_va, y_va = skew(x_va, y_va)
    if cfg.confuse:
        a, b, share = cfg.confuse
        idx = np.flatnonzero(y_tr == a)
        flip = rng.choice(idx, int(len(idx) * share), replace=False)
        y_tr = y_tr.copy()
        y_tr[flip] = b
        idx = np.flatnonzero(y_va == a)
        flip = rng.choice(idx, int(len(idx) * share), replace=False)
        y_va = y_va.copy()
        y_va[flip] = b
    if cfg.task == "digits" and cfg.raw_pixels:
        x_tr, x_va = x_tr * 16.0, x_va * 16.0  # 0..256: images left in 0-255
    else:
        mean, std = float(x_tr.mean()), float(x_tr.std())
        x_tr, x_va = (x_tr - mean) / std, (x_va - mean) / std
    x_tr, x_va = x_tr * cfg.input_scale, x_va * cfg.input_scale
    classes = 2 if cfg.task == "circles" else 10
    return Data(
        torch.from_numpy(x_tr),
        torch.from_numpy(y_tr),
        torch.from_numpy(x_va),
        torch.from_numpy(y_va),
        classes,
    )


# ------------------------------------------------------------------------------ models
_ACTS = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}


def make_model(cfg: RunConfig, data: Data) -> nn.Module:
    torch.manual_seed(cfg.seed)
    if cfg.arch == "cnn":
        model: nn.Module = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64, 32),
            nn.ReLU(),
            nn.Linear(32, data.classes),
        )
    else:
        layers: list[nn.Module] = []
        width = int(np.prod(data.x_train.shape[1:]))
        if cfg.task == "digits":
            layers.append(nn.Flatten())
        for h in cfg.hidden:
            layers += [nn.Linear(width, h), _ACTS[cfg.act]()]
            width = h
        layers.append(nn.Linear(width, data.classes))
        model = nn.Sequential(*layers)
    _initialise(model, cfg)
    for name, p in model.named_parameters():
        if any(name.startswith(prefix) for prefix in cfg.frozen):
            p.requires_grad_(False)
    return model


def _initialise(model: nn.Module, cfg: RunConfig) -> None:
    layers = [m for m in model.modules() if isinstance(m, nn.Linear | nn.Conv2d)]
    with torch.no_grad():
        for index, layer in enumerate(layers):
            layer.weight.mul_(cfg.weight_gain)
            for i, gain in cfg.layer_gain:
                if i == index:
                    layer.weight.mul_(gain)
            if cfg.bias_init is not None and index < len(layers) - 1:
                layer.bias.fill_(cfg.bias_init)
            if cfg.zero_init:
                layer.weight.zero_()
                layer.bias.zero_()


def make_optimizer(cfg: RunConfig, model: nn.Module) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum)
    return torch.optim.Adam(params, lr=cfg.lr)
