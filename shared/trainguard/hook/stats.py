"""Tensor statistics, computed where the tensor lives; a numpy path computes the same ones.

The hot path must not copy tensors to the host or launch dozens of kernels per tensor, so
the PyTorch path reduces on the tensor's device with a handful of vectorised passes and
one small host copy per tensor:

* ``sum(x)`` and ``||x||₂`` (mean, and the variance as ``E[x²] - mean²`` in float64 on the
  host; when the mean dwarfs the spread, so that this would cancel, an exact
  ``var_mean`` in float64 is paid instead),
* ``aminmax(x)`` (min and max in one pass),
* ``a = |x|``; ``sum(a)`` (l1, ``mean_abs = l1 / n``); ``sign_(a)``; ``sum(a)`` (the
  non-zero count: zeros = n - nonzero). On the CPU these elementwise passes are 3-10x
  faster than ``vector_norm(x, 1)`` and ``count_nonzero``, whose kernels are not vectorised.

NaN and Inf counts come for free on the CPU (finite sums prove there are none, so they
are counted only when a sum is not finite). On an accelerator, where Welford's
``std_mean`` is cheap, it replaces the sum of squares, NaN/Inf counts are two more
reductions, and nothing is copied to the host on the training thread: the small result
vectors are copied by the background writer (``PendingStats.finalize``).

Optional reductions (percentiles, histogram, per-unit activity / band fraction) cost
extra passes and run only for collections that ask for them. Percentiles of tensors with
more than ``PERCENTILE_SAMPLE`` elements are taken over an evenly strided sample of that
many elements: exact enough for a 5th-95th percentile spread, and bounded in cost.

An empty tensor has ``numel == 0`` and every other statistic 0 (there is nothing to
report, and NaN would read as "exploding").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainguard.format.documents import MAX_UNITS, MAX_VALUE_COUNTS, MAX_VALUES, Histogram, TensorStats
from trainguard.hook.config import Collection

PERCENTILE_SAMPLE = 1024
#: per-unit fractions are rounded: a 1% threshold needs far less, and it keeps headers small
UNIT_DECIMALS = 5


@dataclass(frozen=True)
class StatSpec:
    """The union of what a tensor's collections ask for."""

    percentiles: tuple[float, ...] = ()
    histogram_bins: int = 0
    histogram_range: tuple[float, float] | None = None
    unit_active: bool = False
    unit_band: tuple[float, float] | None = None
    unit_axis_3d: int = -1
    values: bool = False
    value_counts: bool = False

    @staticmethod
    def of(collections: Iterable[Collection]) -> StatSpec:
        pct: set[float] = set()
        bins = 0
        hrange: tuple[float, float] | None = None
        active = False
        band: tuple[float, float] | None = None
        axis3 = -1
        values = counts = False
        for col in collections:
            values = values or col.values
            counts = counts or col.value_counts
            pct.update(col.percentiles)
            if col.histogram_bins > bins:
                bins, hrange = col.histogram_bins, col.histogram_range
            active = active or col.unit_active
            band = band or col.unit_band
            if col.unit_active or col.unit_band:
                axis3 = col.unit_axis_3d
        return StatSpec(tuple(sorted(pct)), bins, hrange, active, band, axis3, values, counts)


def unit_reduce_dims(shape: Sequence[int], axis_3d: int = -1) -> tuple[int, ...] | None:
    """The dimensions to reduce for per-unit fractions (None when the tensor has no units).

    2-d (N, D): units are the last axis. 3-d: ``axis_3d`` (-1 for (N, T, D), 1 for 1-d
    convolutions (N, C, L)). 4+-d (N, C, ...): the channel axis.
    """
    ndim = len(shape)
    if ndim < 2:
        return None
    if ndim == 2:
        unit = 1
    elif ndim == 3:
        unit = 2 if axis_3d in (-1, 2) else 1
    else:
        unit = 1
    if shape[unit] > MAX_UNITS or shape[unit] == 0:
        return None
    return tuple(d for d in range(ndim) if d != unit)


def _pct_key(p: float) -> str:
    return f"{p:g}"


def _unit_fractions(counts: Any, per_unit: int) -> Any:
    """counts / per_unit rounded to UNIT_DECIMALS, vectorised (numpy or torch: same float64 ops)."""
    scale = 10.0**UNIT_DECIMALS
    if isinstance(counts, np.ndarray):
        return np.round(counts.astype(np.float64) / per_unit * scale) / scale
    import torch

    return torch.round(counts.double() / per_unit * scale) / scale


def _histogram(edges_lo: float, edges_hi: float, counts: Sequence[int]) -> Histogram:
    bins = len(counts)
    step = (edges_hi - edges_lo) / bins
    edges = [edges_lo + i * step for i in range(bins)] + [edges_hi]
    return Histogram(edges=edges, counts=[int(c) for c in counts])


def _hist_range(spec: StatSpec, mn: float, mx: float) -> tuple[float, float] | None:
    lo, hi = spec.histogram_range if spec.histogram_range else (mn, mx)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    if lo == hi:
        lo, hi = lo - 1.0, hi + 1.0  # torch.histc's convention for a constant tensor
    return lo, hi


def empty_stats() -> TensorStats:
    return TensorStats(
        numel=0, mean=0.0, std=0.0, min=0.0, max=0.0, mean_abs=0.0, l1=0.0, l2=0.0, zeros=0, nan=0, inf=0
    )


def _assemble(
    numel: int,
    mean: float,
    std: float,
    mn: float,
    mx: float,
    l1: float,
    nonzero: int,
    nan: int,
    inf: int,
    l2: float | None = None,
    **extra: Any,
) -> TensorStats:
    if l2 is not None:
        pass
    elif math.isfinite(mean) and math.isfinite(std):
        l2 = math.sqrt(max(numel * (std * std + mean * mean), 0.0))
    else:
        l2 = math.inf if nan == 0 else math.nan
    # built without re-validation: every value comes from our own reductions, and the
    # objects are validated by whoever reads them (the trial API, the service)
    return TensorStats.model_construct(
        numel=numel,
        mean=mean,
        std=std,
        min=mn,
        max=mx,
        mean_abs=l1 / numel,
        l1=l1,
        l2=l2,
        zeros=numel - nonzero,
        nan=nan,
        inf=inf,
        **extra,
    )


# --------------------------------------------------------------------------- numpy path


def numpy_stats(array: Any, spec: StatSpec = StatSpec()) -> TensorStats:
    """Statistics of a numpy array (or anything ``np.asarray`` accepts: JAX, lists...)."""
    a = np.asarray(array)
    if a.dtype.kind not in "biuf" and a.dtype.name != "bfloat16":
        raise TypeError(f"cannot compute statistics of dtype {a.dtype}")
    n = int(a.size)
    if n == 0:
        return empty_stats()
    x = a.astype(np.float64, copy=False)
    with np.errstate(invalid="ignore", over="ignore"):
        mean = float(x.mean())
        std = float(x.std())
        mn, mx = float(x.min()), float(x.max())
        l1 = float(np.abs(x).sum())
    nonzero = int(np.count_nonzero(x))
    nan = int(np.isnan(x).sum()) if not math.isfinite(mean) else 0
    inf = int(np.isinf(x).sum()) if not math.isfinite(mean) else 0
    extra: dict[str, Any] = {}
    if spec.percentiles:
        flat = x.reshape(-1)
        if n > PERCENTILE_SAMPLE:
            flat = flat[:: n // PERCENTILE_SAMPLE][:PERCENTILE_SAMPLE]
        values = np.percentile(flat, list(spec.percentiles))
        extra["percentiles"] = {_pct_key(p): float(v) for p, v in zip(spec.percentiles, values, strict=True)}
    if spec.histogram_bins:
        rng = _hist_range(spec, mn, mx)
        if rng is not None:
            counts, _ = np.histogram(x[np.isfinite(x)], bins=spec.histogram_bins, range=rng)
            extra["histogram"] = _histogram(rng[0], rng[1], counts.tolist())
    dims = unit_reduce_dims(a.shape, spec.unit_axis_3d) if (spec.unit_active or spec.unit_band) else None
    if dims is not None:
        if spec.unit_active:
            per_unit = n // a.shape[next(d for d in range(a.ndim) if d not in dims)]
            extra["unit_active"] = _unit_fractions((x > 0).sum(axis=dims), per_unit).tolist()
        if spec.unit_band:
            lo, hi = spec.unit_band
            per_unit = n // a.shape[next(d for d in range(a.ndim) if d not in dims)]
            extra["unit_in_band"] = _unit_fractions(((x >= lo) & (x <= hi)).sum(axis=dims), per_unit).tolist()
            extra["band"] = (lo, hi)
    if a.ndim >= 2:
        extra["samples"] = int(a.shape[0])
    is_int = a.dtype.kind in "biu"
    if (spec.values or (spec.value_counts and is_int)) and n <= MAX_VALUES:
        extra["values"] = [float(v) for v in x.reshape(-1)]
    elif spec.value_counts and is_int:
        uniq, cnt = np.unique(a.reshape(-1), return_counts=True)
        top = np.argsort(-cnt, kind="stable")[:MAX_VALUE_COUNTS]
        extra["value_counts"] = {str(int(uniq[i])): int(cnt[i]) for i in top}
    return _assemble(n, mean, std, mn, mx, l1, nonzero, nan, inf, **extra)


# --------------------------------------------------------------------------- torch path


@dataclass
class PendingStats:
    """Statistics reduced on the device, not yet copied to the host.

    Holds small result tensors (a handful of numbers, or one per unit); ``finalize`` runs
    in the background writer and does the one small host copy per tensor.
    """

    numel: int
    main: Any  # float64 tensor [mean, std, min, max, l1] or a python list
    counts: Any  # int64 tensor [nonzero, nan, inf] or a python list
    spec: StatSpec
    shape: tuple[int, ...]
    percentiles: Any = None
    histogram: Any = None
    unit_active: Any = None
    unit_in_band: Any = None
    values: Any = None
    value_counts: Any = None
    update_l2: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def finalize(self) -> TensorStats:
        if self.numel == 0:
            return empty_stats()
        mean, std, mn, mx, l1 = (float(v) for v in _tolist(self.main))
        nonzero, nan, inf = (int(v) for v in _tolist(self.counts))
        extra: dict[str, Any] = dict(self.extra)
        if self.percentiles is not None:
            picked, frac = self.percentiles
            both = _tolist(picked)
            k = len(frac)
            values = [a + (b - a) * f for a, b, f in zip(both[:k], both[k:], frac, strict=True)]
            extra["percentiles"] = {
                _pct_key(p): float(v) for p, v in zip(self.spec.percentiles, values, strict=True)
            }
        if self.histogram is not None:
            rng = _hist_range(self.spec, mn, mx)
            if rng is not None:
                extra["histogram"] = _histogram(rng[0], rng[1], [int(c) for c in _tolist(self.histogram)])
        if self.unit_active is not None:
            extra["unit_active"] = _tolist(self.unit_active)
        if self.unit_in_band is not None:
            extra["unit_in_band"] = _tolist(self.unit_in_band)
            extra["band"] = self.spec.unit_band
        if len(self.shape) >= 2:
            extra["samples"] = int(self.shape[0])
        if self.values is not None:
            extra["values"] = [float(v) for v in _tolist(self.values)]
        if self.value_counts is not None:
            uniq, cnt = self.value_counts
            extra["value_counts"] = {
                str(int(u)): int(c) for u, c in zip(_tolist(uniq), _tolist(cnt), strict=True)
            }
        if self.update_l2 is not None:
            extra["update_l2"] = float(_tolist(self.update_l2)[0])
        return _assemble(self.numel, mean, std, mn, mx, l1, nonzero, nan, inf, **extra)


def _tolist(value: Any) -> list[Any]:
    if isinstance(value, list):
        return value
    if isinstance(value, int | float):
        return [value]
    out = value.tolist()
    return out if isinstance(out, list) else [out]


def torch_stats(tensor: Any, spec: StatSpec = StatSpec(), *, device_path: bool | None = None) -> PendingStats:
    """Reduce a torch tensor on its device (see the module docstring for the passes).

    ``device_path`` forces the accelerator code path (no host copy here) for a CPU tensor;
    None chooses by the tensor's device. Tests use it to run the GPU path anywhere.
    """
    import torch

    x = tensor.detach()
    shape = tuple(int(d) for d in x.shape)
    n = int(x.numel())
    if n == 0:
        return PendingStats(0, [0.0] * 5, [0, 0, 0], spec, shape)
    if x.is_complex():
        raise TypeError(f"cannot compute statistics of dtype {x.dtype}")
    with torch.no_grad():
        xf = x if x.dtype in (torch.float32, torch.float64) else x.float()
        on_cpu = x.device.type == "cpu" if device_path is None else not device_path
        mn, mx = torch.aminmax(xf)
        # l1 and the non-zero count from one |x| buffer: abs, sum, sign_ (in place), sum are
        # vectorised elementwise passes, 3-10x faster on the CPU than vector_norm(x, 1) and
        # count_nonzero (NaN propagates into the count; that case is recounted below).
        magnitude = xf.abs()
        l1 = magnitude.sum()
        nonzero = magnitude.sign_().sum(dtype=torch.float64)
        if on_cpu:
            # sum and sum of squares are vectorised single passes on the CPU, where
            # std_mean's Welford loop is ~50x slower; the variance is exact enough unless
            # the mean dwarfs the spread, and then we pay for the exact two-pass var_mean.
            total = xf.sum()
            l2 = torch.linalg.vector_norm(xf, 2)
            s, sq, a1, lo, hi, nz = (
                torch.stack([total, l2, l1, mn, mx, nonzero.to(xf.dtype)]).double().tolist()
            )
            counts: Any = [int(nonzero) if math.isfinite(nz) else 0, 0, 0]
            if not (math.isfinite(s) and math.isfinite(sq)):
                # NaN/Inf (or overflow of the squares): count them; rare, so not paid on every tensor
                counts = [
                    int(torch.count_nonzero(xf)),
                    int(torch.isnan(xf).sum()),
                    int(torch.isinf(xf).sum()),
                ]
            mean = s / n
            var = sq * sq / n - mean * mean if math.isfinite(sq) else math.nan
            exact = counts[1] == 0 and counts[2] == 0 and (not math.isfinite(var) or var < 1e-4 * mean * mean)
            if exact and (mean != 0 or var != 0):
                var_t, mean_t = torch.var_mean(xf.double(), correction=0)
                var, mean = float(var_t), float(mean_t)
            std = math.sqrt(max(var, 0.0)) if math.isfinite(var) else math.nan
            main: Any = [mean, std, lo, hi, a1]
        else:
            std_t, mean_t = torch.std_mean(xf, correction=0)
            main = torch.stack([mean_t, std_t, mn, mx, l1]).double()
            nan_count = torch.isnan(xf).sum()
            # NaN made sign() NaN, so count non-zeros exactly when there are NaNs (device-side)
            exact_nonzero = torch.where(nan_count > 0, torch.count_nonzero(xf).double(), nonzero)
            counts = torch.stack([exact_nonzero.long(), nan_count, torch.isinf(xf).sum()])
        pending = PendingStats(n, main, counts, spec, shape)
        if spec.percentiles:
            flat = xf.reshape(-1)
            if n > PERCENTILE_SAMPLE:
                flat = flat[:: n // PERCENTILE_SAMPLE][:PERCENTILE_SAMPLE]
            ordered = torch.sort(flat).values
            idx_lo, idx_hi, frac = _percentile_positions(spec.percentiles, int(ordered.numel()))
            picked = ordered[torch.tensor(idx_lo + idx_hi, device=ordered.device)].double()
            pending.percentiles = (picked, frac)
        if spec.histogram_bins:
            pending.histogram = _torch_histogram(xf, spec, main if on_cpu else None)
        dims = unit_reduce_dims(shape, spec.unit_axis_3d) if (spec.unit_active or spec.unit_band) else None
        if dims is not None:
            unit = next(d for d in range(len(shape)) if d not in dims)
            per_unit = n // shape[unit]
            if spec.unit_active:
                pending.unit_active = _unit_fractions(_unit_count(xf > 0, unit), per_unit)
            if spec.unit_band:
                lo_b, hi_b = spec.unit_band
                pending.unit_in_band = _unit_fractions(
                    _unit_count((xf >= lo_b) & (xf <= hi_b), unit), per_unit
                )
        is_int = not x.is_floating_point()
        if (spec.values or (spec.value_counts and is_int)) and n <= MAX_VALUES:
            pending.values = xf.reshape(-1).double().clone()
        elif spec.value_counts and is_int:
            uniq, cnt = torch.unique(x.reshape(-1), return_counts=True)
            top = torch.topk(cnt, min(MAX_VALUE_COUNTS, int(cnt.numel()))).indices
            pending.value_counts = (uniq[top], cnt[top])
    return pending


def _unit_count(mask: Any, unit: int) -> Any:
    """Per-unit count of True in a boolean tensor; reduces the contiguous trailing dims first."""
    import torch

    if unit == mask.dim() - 1:
        return mask.reshape(-1, mask.shape[-1]).sum(0, dtype=torch.int32)
    lead = mask.shape[0] if unit == 1 else math.prod(mask.shape[:unit])
    inner = mask.reshape(lead, mask.shape[unit], -1).sum(2, dtype=torch.int32)
    return inner.sum(0, dtype=torch.int32)


def _percentile_positions(percentiles: Sequence[float], m: int) -> tuple[list[int], list[int], list[float]]:
    """Indices and weights of numpy's default ('linear') percentile in a sorted sample of m."""
    lo: list[int] = []
    hi: list[int] = []
    frac: list[float] = []
    for p in percentiles:
        pos = p / 100.0 * (m - 1)
        i = math.floor(pos)
        lo.append(i)
        hi.append(min(i + 1, m - 1))
        frac.append(pos - i)
    return lo, hi, frac


def _torch_histogram(xf: Any, spec: StatSpec, main: list[float] | None) -> Any:
    import torch

    if spec.histogram_range is not None:
        lo, hi = spec.histogram_range
    elif main is not None:
        rng = _hist_range(spec, main[2], main[3])
        if rng is None:
            return None
        lo, hi = rng
    else:  # on a device: let histc find the range (it equals our aminmax)
        lo = hi = 0.0
    finite = xf[torch.isfinite(xf)] if main is None or not math.isfinite(main[0]) else xf
    if finite.numel() == 0:
        return None
    return torch.histc(finite, bins=spec.histogram_bins, min=lo, max=hi).long()
