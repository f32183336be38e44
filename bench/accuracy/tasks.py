"""Task families: synthetic data and small models, generated with numpy and torch (no download).

Five PyTorch families and one XGBoost family, each a few seconds of CPU per run:

* ``tabular``: 16 raw features of mixed scale and offset (like unprocessed tabular data),
  4 classes from a fixed random teacher network (8 tanh units) plus 5% label noise; standardised by the
  pipeline with the training set's statistics; an MLP (ReLU or tanh).
* ``cnn``: 32x32 RGB images (0-255) of 4 shape classes (square, disc, cross, stripes) at
  random positions, colours and sizes, with pixel noise; normalised by the pipeline
  (/255, per-channel mean and std); a two-block CNN.
* ``lstm``: padded token sequences (vocabulary 48, lengths 8-32, pad id 0); the class is the
  first of four marker tokens that occurs (the rest are distractors); embedding + LSTM.
* ``transformer``: the same sequences; a one-layer pre-norm transformer encoder with a
  padding mask and mean pooling over real tokens.
* ``resnet``: the images, through a residual network with BatchNorm (test split only).
* ``xgboost``: the tabular features, a binary target from the same teacher (see ``xgb.py``).

A family's data depend on the seed only through sampling; the teacher, prototypes and
vocabulary are fixed, so every seed is the same task.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

CLASSES = 4
TAB_FEATURES = 16
IMG = 32
VOCAB = 48
SEQ_MAX = 32
MARKERS = (1, 2, 3, 4)
PAD = 0


@dataclass
class Split:
    """Raw (un-normalised) samples of one split: what a data pipeline reads from storage."""

    x: np.ndarray
    y: np.ndarray


@dataclass
class Dataset:
    family: str
    train: Split
    val: Split
    classes: int = CLASSES


# ------------------------------------------------------------------------------ tabular
def _teacher() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A fixed random two-layer network labels the tabular data (same for every seed)."""
    rng = np.random.default_rng(7)
    w1 = rng.normal(0, 1, (TAB_FEATURES, 8))
    w2 = rng.normal(0, 1, (8, CLASSES))
    offset = rng.uniform(-50, 200, TAB_FEATURES)  # raw features: offsets and scales of real columns
    scale = np.exp(rng.uniform(np.log(0.5), np.log(80.0), TAB_FEATURES))
    mix = np.linalg.qr(rng.normal(0, 1, (TAB_FEATURES, TAB_FEATURES)))[0]
    return w1, w2, offset, scale, mix


_TEACHER = _teacher()


def tabular_latent(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Standard-normal latent features and the teacher's logits for them."""
    w1, w2, _, _, mix = _TEACHER
    z = rng.normal(0, 1, (n, TAB_FEATURES)) @ mix
    logits = np.tanh(0.5 * z @ w1) @ w2
    return z, logits


def tabular_raw(z: np.ndarray) -> np.ndarray:
    _, _, offset, scale, _ = _TEACHER
    return (z * scale + offset).astype(np.float32)


def _tabular(n: int, rng: np.random.Generator) -> Split:
    z, logits = tabular_latent(n, rng)
    y = logits.argmax(1)
    noisy = rng.random(n) < 0.05  # label noise: the loss stays well above 0
    y[noisy] = rng.integers(0, CLASSES, int(noisy.sum()))
    return Split(tabular_raw(z), y.astype(np.int64))


# ------------------------------------------------------------------------------ images
def _images(n: int, rng: np.random.Generator) -> Split:
    y = rng.integers(0, CLASSES, n)
    yy, xx = np.mgrid[0:IMG, 0:IMG].astype(np.float32)
    cy = rng.uniform(9, 23, n)[:, None, None]
    cx = rng.uniform(9, 23, n)[:, None, None]
    r = rng.uniform(4, 8, n)[:, None, None]
    dy, dx = yy[None] - cy, xx[None] - cx
    masks = np.stack(
        [
            (np.abs(dy) < r) & (np.abs(dx) < r),  # square
            dy**2 + dx**2 < r**2,  # disc
            ((np.abs(dy) < r / 3) | (np.abs(dx) < r / 3)) & (np.abs(dy) < r) & (np.abs(dx) < r),  # cross
            (np.sin(xx[None] * 1.4 + cy) > 0.3) & (np.abs(dy) < r) & (np.abs(dx) < r),  # stripes
        ],
        1,
    )
    shape = masks[np.arange(n), y].astype(np.float32)
    fg = rng.uniform(90, 255, (n, 3, 1, 1)).astype(np.float32)
    bg = rng.uniform(0, 110, (n, 3, 1, 1)).astype(np.float32)
    img = bg + (fg - bg) * shape[:, None]
    img = img + rng.normal(0, 45, img.shape)
    return Split(np.clip(img, 0, 255).astype(np.uint8), y.astype(np.int64))


# ------------------------------------------------------------------------------ sequences
def _sequences(n: int, rng: np.random.Generator) -> Split:
    lengths = rng.integers(8, SEQ_MAX + 1, n)
    x = rng.integers(len(MARKERS) + 1, VOCAB, (n, SEQ_MAX))
    y = rng.integers(0, CLASSES, n)
    for i in range(n):
        length = int(lengths[i])
        first = int(rng.integers(0, max(1, length // 2)))
        x[i, first] = MARKERS[y[i]]
        # later markers of other classes: distractors (only the first one counts)
        for pos in rng.choice(np.arange(first + 1, length), size=min(2, length - first - 1), replace=False):
            x[i, pos] = MARKERS[int(rng.integers(0, CLASSES))]
        x[i, length:] = PAD
    flip = rng.random(n) < 0.05
    y[flip] = rng.integers(0, CLASSES, int(flip.sum()))
    return Split(x.astype(np.int64), y.astype(np.int64))


_GENERATORS = {
    "tabular": _tabular,
    "cnn": _images,
    "resnet": _images,
    "lstm": _sequences,
    "transformer": _sequences,
}
SIZES = {
    "tabular": (4000, 1000),
    "cnn": (2000, 512),
    "resnet": (2000, 512),
    "lstm": (2000, 512),
    "transformer": (2000, 512),
}


def make_dataset(family: str, seed: int) -> Dataset:
    n_train, n_val = SIZES[family]
    rng = np.random.default_rng(10_000 + seed)
    gen = _GENERATORS[family]
    return Dataset(family, gen(n_train, rng), gen(n_val, rng))


# ------------------------------------------------------------------------------ models
class TabularMLP(nn.Module):
    def __init__(self, act: str = "relu", hidden: tuple[int, ...] = (64, 64)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = TAB_FEATURES
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU() if act == "relu" else nn.Tanh()]
            width = h
        layers.append(nn.Linear(width, CLASSES))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(4),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(16 * 4 * 4, 32), nn.ReLU(), nn.Linear(32, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))  # type: ignore[no-any-return]


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.relu1(self.bn1(self.conv1(x)))
        return self.relu2(self.bn2(self.conv2(h)) + self.skip(x))  # type: ignore[no-any-return]


class ResNetBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.block1 = _Block(8, 8, 1)
        self.block2 = _Block(8, 16, 2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.block2(self.block1(self.stem(x)))
        return self.fc(self.pool(h).flatten(1))  # type: ignore[no-any-return]


class LSTMClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, 24, padding_idx=PAD)
        self.lstm = nn.LSTM(24, 48, batch_first=True)
        self.fc = nn.Linear(48, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        lengths = (tokens != PAD).sum(1).clamp(min=1)
        out, _ = self.lstm(self.embedding(tokens))
        last = out[torch.arange(tokens.shape[0]), lengths - 1]
        return self.fc(last)  # type: ignore[no-any-return]


class _EncoderLayer(nn.Module):
    """Pre-norm encoder layer; its feed-forward ReLU is a module, so the hook sees it."""

    def __init__(self, d: int, heads: int, ff: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(d)
        self.ff1 = nn.Linear(d, ff)
        self.relu = nn.ReLU()
        self.ff2 = nn.Linear(ff, d)

    def forward(self, h: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        a = self.norm1(h)
        h = h + self.attn(a, a, a, key_padding_mask=pad, need_weights=False)[0]
        return h + self.ff2(self.relu(self.ff1(self.norm2(h))))  # type: ignore[no-any-return]


class TinyTransformer(nn.Module):
    def __init__(self, d: int = 32, layers: int = 1) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, d, padding_idx=PAD)
        self.position = nn.Embedding(4 * SEQ_MAX, d)
        self.layers = nn.ModuleList([_EncoderLayer(d, 4, 2 * d) for _ in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pad = tokens == PAD
        pos = torch.arange(tokens.shape[1]).unsqueeze(0)
        h = self.embedding(tokens) + self.position(pos)
        for layer in self.layers:
            h = layer(h, pad)
        keep = (~pad).unsqueeze(-1).float()
        pooled = (self.norm(h) * keep).sum(1) / keep.sum(1).clamp(min=1.0)
        return self.fc(pooled)  # type: ignore[no-any-return]


def make_model(family: str, act: str = "relu") -> nn.Module:
    if family == "tabular":
        return TabularMLP(act)
    if family == "cnn":
        return SmallCNN()
    if family == "resnet":
        return ResNetBN()
    if family == "lstm":
        return LSTMClassifier()
    if family == "transformer":
        return TinyTransformer()
    raise ValueError(f"unknown family {family!r}")


def weight_layers(model: nn.Module) -> list[nn.Module]:
    """The model's weight-bearing layers in order (Linear, Conv2d, Embedding)."""
    return [m for m in model.modules() if isinstance(m, nn.Linear | nn.Conv2d | nn.Embedding)]


def cosine(step: int, total: int) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total))
