"""Tensor statistics, computed where the tensor lives, only those that were asked for.

A tensor's ``StatSpec`` names the ``TensorStats`` fields to compute (``fields``: what the
configured rules read plus what the user asked for; see ``trainguard.hook.selection``) and
the optional reductions with their parameters. Each base field costs a pass, so only the
passes the wanted fields need are run:

====================  ===========================================================
fields                passes (CPU)
====================  ===========================================================
``mean``              ``sum(x)``
``std``, ``l2``       ``sum(x)`` and ``x·x`` (one BLAS dot): the variance as
                      ``E[x²] - mean²`` in float64 on the host; when the mean dwarfs
                      the spread, so that this would cancel, an exact float64
                      ``var_mean`` is paid instead
``min``, ``max``      ``amin``/``amax`` (``aminmax`` when both)
``l1``, ``mean_abs``  ``|x|`` into a per-thread scratch buffer, ``sum`` (a fresh ``|x|``
                      tensor would cost 3-4x the read: its pages are faulted in anew
                      each time); tensors above ``SCRATCH_ELEMENTS`` go in chunks
``zeros``             ``sign_`` of that buffer, ``sum`` (3-10x faster on the CPU than
                      ``count_nonzero``, whose kernel is not vectorised)
``nan``, ``inf``      free: a finite sum proves there are none; they are counted only
                      when a sum is not finite (a sum is added if no other field needs one)
====================  ===========================================================

So the default rules' gradient statistics (``mean_abs``, ``nan``, ``inf``) cost one ``|x|``
and one sum per gradient, exactly the ``abs().sum()`` floor of the benchmark.

On an accelerator the same fields are reduced by one kernel each (``vector_norm(x, 1)``,
Welford's ``std_mean``, ``count_nonzero``, ``isnan``/``isinf`` sums), stacked into one small
device vector and copied to pinned host memory with a non-blocking copy: the training
thread never waits for the device. The background writer waits on the copy's event
(``PendingStats.finalize``).

Optional reductions (percentiles, histogram, per-unit activity / band fraction, values,
value counts) cost extra passes and run only when asked for. Percentiles of tensors with
more than ``PERCENTILE_SAMPLE`` elements are taken over an evenly strided sample of that
many elements: exact enough for a 5th-95th percentile spread, and bounded in cost.

An empty tensor has ``numel == 0`` and every other statistic asked for 0 (there is nothing
to report, and NaN would read as "exploding").
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainguard.format.documents import (
    MAX_UNITS,
    MAX_VALUE_COUNTS,
    MAX_VALUES,
    Histogram,
    TensorStats,
    construct,
)
from trainguard.hook.config import STANDARD_STATISTICS, Collection

PERCENTILE_SAMPLE = 1024
#: largest ``|x|`` scratch buffer per thread and dtype (4 MiB of float32); bigger tensors are
#: reduced chunk by chunk, so the hook's extra memory is bounded whatever the model's size
SCRATCH_ELEMENTS = 1 << 20
#: per-unit fractions are rounded: a 1% threshold needs far less, and it keeps headers small
UNIT_DECIMALS = 5
#: the scalar statistics computed by passes over the tensor (``numel`` and ``samples`` are free)
BASE_FIELDS = frozenset(STANDARD_STATISTICS)
#: ``TensorStats`` fields a record must carry whatever was asked (the contract's required fields)
REQUIRED_FIELDS = frozenset(name for name, info in TensorStats.model_fields.items() if info.is_required())
_ORDER = ("mean", "std", "min", "max", "l1", "l2")


@dataclass(frozen=True)
class StatSpec:
    """What to compute for one tensor: base fields, and the optional reductions with parameters."""

    percentiles: tuple[float, ...] = ()
    histogram_bins: int = 0
    histogram_range: tuple[float, float] | None = None
    unit_active: bool = False
    unit_band: tuple[float, float] | None = None
    unit_axis_3d: int = -1
    values: bool = False
    value_counts: bool = False
    #: base fields (``BASE_FIELDS``) to compute; the contract's required fields are always added
    fields: frozenset[str] = BASE_FIELDS
    #: optional fields named explicitly (a rule reads them): both ``values`` and
    #: ``value_counts`` of a small integer tensor, say, where one would otherwise do
    named: frozenset[str] = frozenset()

    @property
    def base(self) -> frozenset[str]:
        return (self.fields | REQUIRED_FIELDS) & BASE_FIELDS

    def is_empty(self) -> bool:
        """Nothing but ``numel`` would be computed."""
        return (
            self.base <= {"numel"}
            and not (self.percentiles or self.histogram_bins or self.unit_active or self.unit_band)
            and not (self.values or self.value_counts)
        )

    @staticmethod
    def of(collections: Iterable[Collection], fields: Iterable[str] | None = None) -> StatSpec:
        """The union of what ``collections`` configure; ``fields`` (None: every field) selects.

        With ``fields`` given, an optional reduction runs only if it is in ``fields`` and
        takes its parameters from the collections (percentiles, band, bins), or sensible
        defaults when no collection sets them.
        """
        cols = list(collections)
        wanted = None if fields is None else frozenset(fields)

        def want(name: str) -> bool:
            return wanted is None or name in wanted

        pct: set[float] = set()
        bins = 0
        hrange: tuple[float, float] | None = None
        active = False
        band: tuple[float, float] | None = None
        axis3 = -1
        values = counts = False
        for col in cols:
            values = values or col.values
            counts = counts or col.value_counts
            pct.update(col.percentiles)
            if col.histogram_bins > bins:
                bins, hrange = col.histogram_bins, col.histogram_range
            active = active or col.unit_active
            band = band or col.unit_band
            if col.unit_active or col.unit_band:
                axis3 = col.unit_axis_3d
        if wanted is not None:
            if "percentiles" in wanted and not pct:
                pct = {5.0, 50.0, 95.0}
            if "histogram" in wanted and not bins:
                bins = 64
            active = active or "unit_active" in wanted
            values = values or "values" in wanted
            counts = counts or "value_counts" in wanted
        return StatSpec(
            percentiles=tuple(sorted(pct)) if want("percentiles") else (),
            histogram_bins=bins if want("histogram") else 0,
            histogram_range=hrange if want("histogram") else None,
            unit_active=active and want("unit_active"),
            unit_band=band if want("unit_in_band") else None,
            unit_axis_3d=axis3,
            values=values and want("values"),
            value_counts=counts and want("value_counts"),
            fields=BASE_FIELDS if wanted is None else frozenset(wanted & BASE_FIELDS),
            named=frozenset() if wanted is None else frozenset(wanted - BASE_FIELDS),
        )


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


def empty_stats(fields: Iterable[str] = BASE_FIELDS) -> TensorStats:
    values: dict[str, Any] = {}
    for name in frozenset(fields) | REQUIRED_FIELDS:
        if name in BASE_FIELDS:
            values[name] = 0 if name in ("numel", "zeros", "nan", "inf") else 0.0
    return construct(TensorStats, **values)


def _assemble(
    fields: frozenset[str], numel: int, base: dict[str, float], extra: dict[str, Any]
) -> TensorStats:
    """A TensorStats with the wanted fields, derived from the raw sums in ``base``.

    ``base`` holds what was reduced: ``sum``, ``sumsq`` (or ``mean``/``std`` directly),
    ``min``, ``max``, ``l1``, ``nonzero``, ``nan``, ``inf``.
    """
    out: dict[str, Any] = {"numel": numel}
    if "mean" in base:
        mean = base["mean"]
    elif "sum" in base:
        mean = base["sum"] / numel
    else:
        mean = math.nan
    if "mean" in fields:
        out["mean"] = mean
    if "std" in fields:
        out["std"] = base["std"]
    if "min" in fields:
        out["min"] = base["min"]
    if "max" in fields:
        out["max"] = base["max"]
    if "l1" in fields:
        out["l1"] = base["l1"]
    if "mean_abs" in fields:
        out["mean_abs"] = base["l1"] / numel
    if "l2" in fields:
        if "l2" in base:
            out["l2"] = base["l2"]
        else:
            std = base["std"]
            if math.isfinite(mean) and math.isfinite(std):
                out["l2"] = math.sqrt(max(numel * (std * std + mean * mean), 0.0))
            else:
                out["l2"] = math.inf if base.get("nan", 0) == 0 else math.nan
    if "zeros" in fields:
        out["zeros"] = numel - int(base["nonzero"])
    if "nan" in fields:
        out["nan"] = int(base.get("nan", 0))
    if "inf" in fields:
        out["inf"] = int(base.get("inf", 0))
    out.update(extra)
    # built without re-validation: every value comes from our own reductions, and the
    # objects are validated by whoever reads them (the trial API, the service)
    return construct(TensorStats, **out)


def _std_from_sums(total: float, sumsq: float, n: int) -> tuple[float, float]:
    """(mean, std) from the sum and sum of squares (float64 on the host)."""
    mean = total / n
    var = sumsq / n - mean * mean if math.isfinite(sumsq) else math.nan
    return mean, (math.sqrt(max(var, 0.0)) if math.isfinite(var) else math.nan)


# --------------------------------------------------------------------------- numpy path


def numpy_stats(array: Any, spec: StatSpec = StatSpec()) -> TensorStats:
    """Statistics of a numpy array (or anything ``np.asarray`` accepts: JAX, lists...)."""
    a = np.asarray(array)
    if a.dtype.kind not in "biuf" and a.dtype.name != "bfloat16":
        raise TypeError(f"cannot compute statistics of dtype {a.dtype}")
    fields = spec.base
    n = int(a.size)
    extra: dict[str, Any] = {}
    if a.ndim >= 2:
        extra["samples"] = int(a.shape[0])
    if n == 0:
        empty = empty_stats(fields)
        return empty.model_copy(update=extra) if extra else empty
    x = a.astype(np.float64, copy=False)
    base: dict[str, float] = {}
    with np.errstate(invalid="ignore", over="ignore"):
        if fields & {"mean", "std", "l2"}:
            base["mean"] = float(x.mean())
        if fields & {"std", "l2"}:
            base["std"] = float(x.std())
        if "min" in fields:
            base["min"] = float(x.min())
        if "max" in fields:
            base["max"] = float(x.max())
        if fields & {"l1", "mean_abs"}:
            base["l1"] = float(np.abs(x).sum())
    if "zeros" in fields:
        base["nonzero"] = int(np.count_nonzero(x))
    if fields & {"nan", "inf"}:
        probe = base.get("mean", base.get("l1"))
        if probe is None:
            with np.errstate(invalid="ignore", over="ignore"):
                probe = float(x.sum())
        if not math.isfinite(probe):
            base["nan"] = int(np.isnan(x).sum())
            base["inf"] = int(np.isinf(x).sum())
    need_range = bool(spec.histogram_bins)
    if need_range and spec.histogram_range is None:
        with np.errstate(invalid="ignore"):
            lo, hi = (float(np.nanmin(x)), float(np.nanmax(x))) if not np.isnan(x).all() else (0.0, 0.0)
    else:
        lo, hi = spec.histogram_range or (0.0, 0.0)
    if spec.percentiles:
        flat = x.reshape(-1)
        if n > PERCENTILE_SAMPLE:
            flat = flat[:: n // PERCENTILE_SAMPLE][:PERCENTILE_SAMPLE]
        values = np.percentile(flat, list(spec.percentiles))
        extra["percentiles"] = {_pct_key(p): float(v) for p, v in zip(spec.percentiles, values, strict=True)}
    if spec.histogram_bins:
        rng = _hist_range(spec, lo, hi)
        if rng is not None:
            counts, _ = np.histogram(x[np.isfinite(x)], bins=spec.histogram_bins, range=rng)
            extra["histogram"] = _histogram(rng[0], rng[1], counts.tolist())
    dims = unit_reduce_dims(a.shape, spec.unit_axis_3d) if (spec.unit_active or spec.unit_band) else None
    if dims is not None:
        per_unit = n // a.shape[next(d for d in range(a.ndim) if d not in dims)]
        if spec.unit_active:
            extra["unit_active"] = _unit_fractions((x > 0).sum(axis=dims), per_unit).tolist()
        if spec.unit_band:
            band_lo, band_hi = spec.unit_band
            extra["unit_in_band"] = _unit_fractions(
                ((x >= band_lo) & (x <= band_hi)).sum(axis=dims), per_unit
            ).tolist()
            extra["band"] = (band_lo, band_hi)
    is_int = a.dtype.kind in "biu"
    if (spec.values or (spec.value_counts and is_int)) and n <= MAX_VALUES:
        extra["values"] = [float(v) for v in x.reshape(-1)]
    if spec.value_counts and is_int and (n > MAX_VALUES or "value_counts" in spec.named):
        uniq, cnt = np.unique(a.reshape(-1), return_counts=True)
        top = np.argsort(-cnt, kind="stable")[:MAX_VALUE_COUNTS]
        extra["value_counts"] = {str(int(uniq[i])): int(cnt[i]) for i in top}
    return _assemble(fields, n, base, extra)


# --------------------------------------------------------------------------- torch path


@dataclass
class PendingStats:
    """Statistics reduced on the device, not yet on the host.

    On the CPU everything is already host numbers (``base``). On an accelerator ``packed`` is
    a small device (or pinned host) vector whose entries are named by ``packed_names``,
    copied without blocking; ``ready`` is the copy's event. ``finalize`` runs in the
    background writer: it waits for the event and builds the ``TensorStats``.
    """

    numel: int
    spec: StatSpec
    shape: tuple[int, ...]
    base: dict[str, float] = field(default_factory=dict)
    packed: Any = None
    packed_names: tuple[str, ...] = ()
    ready: Any = None
    percentiles: Any = None
    histogram: Any = None
    unit_active: Any = None
    unit_in_band: Any = None
    values: Any = None
    value_counts: Any = None
    update_l2: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def finalize(self) -> TensorStats:
        if self.ready is not None:
            self.ready.synchronize()
        fields = self.spec.base
        extra: dict[str, Any] = dict(self.extra)
        if len(self.shape) >= 2:
            extra["samples"] = int(self.shape[0])
        if self.numel == 0:
            empty = empty_stats(fields)
            return empty.model_copy(update=extra) if extra else empty
        base = dict(self.base)
        if self.packed is not None:
            base.update(zip(self.packed_names, (float(v) for v in _tolist(self.packed)), strict=True))
            if "sumsq" in base and "std" not in base and "sum" in base:
                base["mean"], base["std"] = _std_from_sums(base["sum"], base["sumsq"], self.numel)
        if self.percentiles is not None:
            picked, frac = self.percentiles
            both = _tolist(picked)
            k = len(frac)
            values = [a + (b - a) * f for a, b, f in zip(both[:k], both[k:], frac, strict=True)]
            extra["percentiles"] = {
                _pct_key(p): float(v) for p, v in zip(self.spec.percentiles, values, strict=True)
            }
        if self.histogram is not None:
            counts, lo, hi = self.histogram
            lo = base.get("min", lo) if lo is None else lo
            hi = base.get("max", hi) if hi is None else hi
            rng = _hist_range(self.spec, float(lo), float(hi)) if lo is not None and hi is not None else None
            if rng is not None:
                extra["histogram"] = _histogram(rng[0], rng[1], [int(c) for c in _tolist(counts)])
        if self.unit_active is not None:
            extra["unit_active"] = _tolist(self.unit_active)
        if self.unit_in_band is not None:
            extra["unit_in_band"] = _tolist(self.unit_in_band)
            extra["band"] = self.spec.unit_band
        if self.values is not None:
            extra["values"] = [float(v) for v in _tolist(self.values)]
        if self.value_counts is not None:
            uniq, cnt = self.value_counts
            extra["value_counts"] = {
                str(int(u)): int(c) for u, c in zip(_tolist(uniq), _tolist(cnt), strict=True)
            }
        if self.update_l2 is not None:
            extra["update_l2"] = float(_tolist(self.update_l2)[0])
        return _assemble(fields, self.numel, base, extra)


def _tolist(value: Any) -> list[Any]:
    if isinstance(value, list):
        return value
    if isinstance(value, int | float):
        return [value]
    out = value.tolist()
    return out if isinstance(out, list) else [out]


_scratch = threading.local()


def _scratch_buffer(like: Any, n: int) -> Any:
    """A reusable 1-d buffer like ``like`` (dtype, device) of ``n`` (<= SCRATCH_ELEMENTS) elements."""
    import torch

    buffers: dict[Any, Any] = _scratch.__dict__.setdefault("buffers", {})
    key = (like.dtype, like.device)
    buf = buffers.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.empty(min(max(n, 4096), SCRATCH_ELEMENTS), dtype=like.dtype, device=like.device)
        buffers[key] = buf
    return buf[:n]


def _abs_sums(flat: Any, *, nonzero: bool) -> tuple[Any, Any]:
    """(sum |x|, count of non-zeros or None) of a 1-d CPU float tensor, through the scratch buffer.

    NaN stays NaN in both sums, which is how the caller notices non-finite values.
    """
    import torch

    n = int(flat.numel())
    if not flat.is_contiguous():
        flat = flat.contiguous()
    l1: list[Any] = []
    counts: list[Any] = []
    for start in range(0, n, SCRATCH_ELEMENTS):
        chunk = flat[start : start + SCRATCH_ELEMENTS]
        buf = _scratch_buffer(flat, int(chunk.numel()))
        torch.abs(chunk, out=buf)
        l1.append(buf.sum())
        if nonzero:
            counts.append(buf.sign_().sum(dtype=flat.dtype))
    # chunks add up in float64: a float32 count stops being exact past 2**24 elements
    total = l1[0] if len(l1) == 1 else torch.stack(l1).double().sum()
    if not nonzero:
        return total, None
    return total, counts[0] if len(counts) == 1 else torch.stack(counts).double().sum()


def torch_stats(tensor: Any, spec: StatSpec = StatSpec(), *, device_path: bool | None = None) -> PendingStats:
    """Reduce a torch tensor on its device, only the passes ``spec`` needs (module docstring).

    ``device_path`` forces the accelerator code path (no host sync here) for a CPU tensor;
    None chooses by the tensor's device. Tests use it to run the accelerator path anywhere.
    """
    import torch

    x = tensor.detach()
    shape = tuple(int(d) for d in x.shape)
    n = int(x.numel())
    if n == 0:
        return PendingStats(0, spec, shape)
    if x.is_complex():
        raise TypeError(f"cannot compute statistics of dtype {x.dtype}")
    with torch.no_grad():
        xf = x if x.dtype in (torch.float32, torch.float64) else x.float()
        on_cpu = x.device.type == "cpu" if device_path is None else not device_path
        pending = _cpu_base(xf, spec, shape, n) if on_cpu else _device_base(xf, spec, shape, n)
        _optional(xf, x, spec, shape, n, pending, on_cpu)
    return pending


def _cpu_base(xf: Any, spec: StatSpec, shape: tuple[int, ...], n: int) -> PendingStats:
    """The CPU passes: vectorised sums, one host copy of a handful of numbers."""
    import torch

    fields = spec.base
    names: list[str] = []
    parts: list[Any] = []
    flat = xf.reshape(-1)
    if fields & {"mean", "std", "l2"}:
        names.append("sum")
        parts.append(flat.sum())
    if fields & {"std", "l2"}:
        names.append("sumsq")
        parts.append(torch.dot(flat, flat) if flat.is_contiguous() else (flat * flat).sum())
    want_min, want_max = "min" in fields, "max" in fields
    if want_min and want_max:
        lo, hi = torch.aminmax(flat)
        names += ["min", "max"]
        parts += [lo, hi]
    elif want_min:
        names.append("min")
        parts.append(flat.amin())
    elif want_max:
        names.append("max")
        parts.append(flat.amax())
    if fields & {"l1", "mean_abs", "zeros"}:
        # sign_ of |x|: 1 for every non-zero (NaN stays NaN: recounted below)
        l1, nonzero = _abs_sums(flat, nonzero="zeros" in fields)
        names.append("l1")
        parts.append(l1)
        if nonzero is not None:
            names.append("nonzero")
            parts.append(nonzero)
    if fields & {"nan", "inf"} and not parts:
        names.append("sum")
        parts.append(flat.sum())
    values = torch.stack(parts).double().tolist() if parts else []
    base = dict(zip(names, values, strict=True))
    if fields & {"nan", "inf", "zeros"} and not all(math.isfinite(v) for v in values):
        # NaN/Inf (or overflow of a sum): count exactly; rare, so not paid on every tensor
        base["nan"] = int(torch.isnan(flat).sum())
        base["inf"] = int(torch.isinf(flat).sum())
        if "zeros" in fields:
            base["nonzero"] = int(torch.count_nonzero(flat))
    if "sumsq" in base:
        mean, std = _std_from_sums(base["sum"], base["sumsq"], n)
        var = std * std
        exact = (
            base.get("nan", 0) == 0
            and base.get("inf", 0) == 0
            and (not math.isfinite(var) or var < 1e-4 * mean * mean)
        )
        if exact and (mean != 0 or var != 0):
            var_t, mean_t = torch.var_mean(flat.double(), correction=0)
            var, mean = float(var_t), float(mean_t)
            std = math.sqrt(max(var, 0.0)) if math.isfinite(var) else math.nan
        base["mean"], base["std"] = mean, std
        base["l2"] = math.sqrt(base["sumsq"]) if base["sumsq"] >= 0 else math.nan
    return PendingStats(n, spec, shape, base=base)


def _device_base(xf: Any, spec: StatSpec, shape: tuple[int, ...], n: int) -> PendingStats:
    """One kernel per field on the device, stacked; copied to the host without blocking."""
    import torch

    fields = spec.base
    names: list[str] = []
    parts: list[Any] = []
    if fields & {"mean", "std", "l2"}:
        std_t, mean_t = torch.std_mean(xf, correction=0)
        names += ["mean", "std"]
        parts += [mean_t, std_t]
    if "l2" in fields:
        names.append("l2")
        parts.append(torch.linalg.vector_norm(xf, 2))
    if "min" in fields and "max" in fields:
        lo, hi = torch.aminmax(xf)
        names += ["min", "max"]
        parts += [lo, hi]
    elif "min" in fields:
        names.append("min")
        parts.append(xf.amin())
    elif "max" in fields:
        names.append("max")
        parts.append(xf.amax())
    if fields & {"l1", "mean_abs"}:
        names.append("l1")
        parts.append(torch.linalg.vector_norm(xf, 1))
    if "zeros" in fields:
        names.append("nonzero")
        parts.append(torch.count_nonzero(xf))
    if fields & {"nan", "inf"}:
        names += ["nan", "inf"]
        parts += [torch.isnan(xf).sum(), torch.isinf(xf).sum()]
    pending = PendingStats(n, spec, shape)
    if parts:
        packed = torch.stack([p.double() for p in parts])
        pending.packed, pending.ready = _to_host(packed)
        pending.packed_names = tuple(names)
    return pending


def _to_host(value: Any) -> tuple[Any, Any]:
    """Start copying a small device tensor to (pinned) host memory; (host tensor, event or None)."""
    import torch

    if value.device.type == "cuda":
        host = torch.empty(value.shape, dtype=value.dtype, device="cpu", pin_memory=True)
        host.copy_(value, non_blocking=True)
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record()
        return host, event
    return value, None


def _optional(
    xf: Any, x: Any, spec: StatSpec, shape: tuple[int, ...], n: int, pending: PendingStats, on_cpu: bool
) -> None:
    import torch

    if spec.percentiles:
        flat = xf.reshape(-1)
        if n > PERCENTILE_SAMPLE:
            flat = flat[:: n // PERCENTILE_SAMPLE][:PERCENTILE_SAMPLE]
        ordered = torch.sort(flat).values
        idx_lo, idx_hi, frac = _percentile_positions(spec.percentiles, int(ordered.numel()))
        picked = ordered[torch.tensor(idx_lo + idx_hi, device=ordered.device)].double()
        pending.percentiles = (picked, frac)
    if spec.histogram_bins:
        pending.histogram = _torch_histogram(xf, spec, pending.base if on_cpu else None)
    dims = unit_reduce_dims(shape, spec.unit_axis_3d) if (spec.unit_active or spec.unit_band) else None
    if dims is not None:
        unit = next(d for d in range(len(shape)) if d not in dims)
        per_unit = n // shape[unit]
        fast = on_cpu and per_unit < _EXACT_FLOAT_COUNT and xf.device.type == "cpu"
        if spec.unit_active:
            active = _unit_count_above(xf, 0.0, unit) if fast else None
            if active is None:
                active = _unit_count(xf > 0, unit)
            pending.unit_active = _unit_fractions(active, per_unit)
        if spec.unit_band:
            lo_b, hi_b = spec.unit_band
            in_band = None
            if fast:
                # lo <= x <= hi  ==  (x >= lo) minus (x > hi); NaN is in neither
                at_least = _unit_count_above(xf, lo_b, unit, inclusive=True)
                above = _unit_count_above(xf, hi_b, unit)
                if at_least is not None and above is not None:
                    in_band = at_least - above
            if in_band is None:
                in_band = _unit_count((xf >= lo_b) & (xf <= hi_b), unit)
            pending.unit_in_band = _unit_fractions(in_band, per_unit)
    is_int = not x.is_floating_point()
    if (spec.values or (spec.value_counts and is_int)) and n <= MAX_VALUES:
        pending.values = xf.reshape(-1).double().clone()
    if spec.value_counts and is_int and (n > MAX_VALUES or "value_counts" in spec.named):
        uniq, cnt = torch.unique(x.reshape(-1), return_counts=True)
        top = torch.topk(cnt, min(MAX_VALUE_COUNTS, int(cnt.numel()))).indices
        pending.value_counts = (uniq[top], cnt[top])


#: float32 counts 0/1 exactly up to 2**24: the scratch path's sums stay integers below it
_EXACT_FLOAT_COUNT = 1 << 24


def _unit_count_above(xf: Any, threshold: float, unit: int, *, inclusive: bool = False) -> Any:
    """Per-unit count of ``x > threshold`` (``>=`` when inclusive) of a CPU float tensor, or None.

    The tensor is seen as (A, units, B) (B = 1 when the units are the last axis). The
    comparison goes into the per-thread scratch buffer as 0/1 floats, slices of A at a time,
    and one BLAS product per slice sums them over A: no boolean mask is allocated (1.2-2.3x
    faster than ``_unit_count``, measured on ReLU outputs of dense and conv layers).
    None when one slice of A exceeds the scratch size.
    """
    import torch

    compare = torch.ge if inclusive else torch.gt
    if unit == xf.dim() - 1:
        grouped = xf.reshape(-1, int(xf.shape[-1]), 1)
    else:  # unit == 1: (N, C, rest...)
        grouped = xf.reshape(int(xf.shape[0]), int(xf.shape[1]), -1)
    a, units, b = (int(d) for d in grouped.shape)
    step = SCRATCH_ELEMENTS // max(units * b, 1)
    if step == 0 or a == 0:
        return None
    total = None
    for start in range(0, a, step):
        part = grouped[start : start + step].reshape(-1, units * b)
        buf = _scratch_buffer(xf, int(part.numel())).view(part.shape)
        compare(part, threshold, out=buf)
        counted = torch.ones(1, int(part.shape[0]), dtype=xf.dtype) @ buf
        total = counted if total is None else total + counted
    assert total is not None
    return total.reshape(units, b).sum(1).round().to(torch.int64)


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


def _torch_histogram(xf: Any, spec: StatSpec, host: dict[str, float] | None) -> Any:
    """(counts, lo, hi): the range is the spec's, else the tensor's finite min..max."""
    import torch

    finite = xf[torch.isfinite(xf)] if not bool(torch.isfinite(xf).all()) else xf
    if finite.numel() == 0:
        return None
    if spec.histogram_range is not None:
        lo, hi = spec.histogram_range
    else:
        lo_t, hi_t = torch.aminmax(finite)
        lo, hi = float(lo_t), float(hi_t)
    rng = _hist_range(spec, lo, hi)
    if rng is None:
        return None
    counts = torch.histc(finite, bins=spec.histogram_bins, min=rng[0], max=rng[1]).long()
    return counts, rng[0], rng[1]


#: fields the batched accelerator path reduces with ``torch._foreach_norm`` (one launch group)
_FOREACH_FIELDS = frozenset({"numel", "l1", "mean_abs", "l2", "nan", "inf"})


def torch_stats_many(
    tensors: Sequence[Any], specs: Sequence[StatSpec | None], *, device_path: bool | None = None
) -> list[PendingStats | None]:
    """Reduce many tensors at once (a step's gradients or weights); None where ``specs`` is None.

    On the CPU each tensor takes the vectorised passes of ``torch_stats``. On an
    accelerator, tensors that need only norms and non-finite counts (what the default rules
    read of gradients) are reduced by ``torch._foreach_norm`` over the whole group (a few
    launches instead of several per tensor), everything else per tensor, and all the small
    results travel to the host in one non-blocking copy with one event. ``device_path``
    forces (True) or forbids (False) the accelerator path, as in ``torch_stats``.
    """
    import torch

    out: list[PendingStats | None] = [None] * len(tensors)
    groups: dict[tuple[Any, Any], list[int]] = {}
    cpu_group: list[int] = []
    singles: list[int] = []
    for i, (t, spec) in enumerate(zip(tensors, specs, strict=True)):
        if spec is None:
            continue
        x = t.detach()
        on_device = x.device.type != "cpu" if device_path is None else device_path
        norms_only = (
            x.numel() > 0
            and spec.base <= _FOREACH_FIELDS
            and not spec.is_empty()
            and not (spec.percentiles or spec.histogram_bins or spec.unit_active or spec.unit_band)
            and not (spec.values or spec.value_counts)
        )
        if (
            norms_only
            and on_device
            and x.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
        ):
            groups.setdefault((x.device, x.dtype), []).append(i)
        elif norms_only and not on_device and x.dtype in (torch.float32, torch.float64):
            cpu_group.append(i)
        else:
            singles.append(i)
    if cpu_group:
        _cpu_norms(tensors, specs, cpu_group, out)
    for i in singles:
        spec = specs[i]
        assert spec is not None
        out[i] = torch_stats(tensors[i], spec, device_path=device_path)
    for (_device, _dtype), idx in groups.items():
        xs = [tensors[i].detach() for i in idx]
        group_specs = [s for s in (specs[i] for i in idx) if s is not None]
        with torch.no_grad():
            l1 = torch._foreach_norm(xs, 1)
            want_l2 = any("l2" in s.base for s in group_specs)
            l2 = torch._foreach_norm(xs, 2) if want_l2 else None
            counted = any(s.base & {"nan", "inf"} for s in group_specs)
            nonfinite = [(~torch.isfinite(x)).sum() for x in xs] if counted else None
            nans = [torch.isnan(x).sum() for x in xs] if nonfinite is not None else None
            rows = []
            for k in range(len(xs)):
                row = [l1[k].double()]
                row.append(l2[k].double() if l2 is not None else l1[k].double())
                if nonfinite is not None and nans is not None:
                    row += [nans[k].double(), (nonfinite[k] - nans[k]).double()]
                else:
                    row += [torch.zeros((), dtype=torch.float64, device=xs[k].device)] * 2
                rows.append(torch.stack(row))
            host, ready = _to_host(torch.stack(rows))
        for k, i in enumerate(idx):
            spec = specs[i]
            assert spec is not None
            out[i] = PendingStats(
                int(xs[k].numel()),
                spec,
                tuple(int(d) for d in xs[k].shape),
                packed=host[k],
                packed_names=("l1", "l2", "nan", "inf"),
                ready=ready,
            )
    return out


def _cpu_norms(
    tensors: Sequence[Any], specs: Sequence[StatSpec | None], idx: list[int], out: list[PendingStats | None]
) -> None:
    """Norms of many CPU tensors with one host copy: ``|x|`` and a sum (l1), ``x·x`` (l2) each,
    then one stack; non-finite counts only for a tensor whose sums are not finite."""
    import torch

    with torch.no_grad():
        xs = [tensors[i].detach().reshape(-1) for i in idx]
        want_l1 = [bool(specs[i].base & {"l1", "mean_abs", "nan", "inf"}) for i in idx]  # type: ignore[union-attr]
        want_l2 = ["l2" in specs[i].base for i in idx]  # type: ignore[union-attr]
        parts: list[Any] = []
        for x, l1, l2 in zip(xs, want_l1, want_l2, strict=True):
            parts.append(_abs_sums(x, nonzero=False)[0] if l1 or not l2 else x.new_zeros(()))
            parts.append(torch.dot(x, x) if l2 else x.new_zeros(()))
        values = torch.stack([p.double() for p in parts]).tolist()
    for k, i in enumerate(idx):
        spec = specs[i]
        assert spec is not None
        x = xs[k]
        l1, sumsq = values[2 * k], values[2 * k + 1]
        base: dict[str, float] = {"l1": l1, "l2": math.sqrt(sumsq) if sumsq >= 0 else math.nan}
        if not (math.isfinite(l1) and math.isfinite(sumsq)):
            base["nan"] = int(torch.isnan(x).sum())
            base["inf"] = int(torch.isinf(x).sum())
        out[i] = PendingStats(int(x.numel()), spec, tuple(int(d) for d in tensors[i].shape), base=base)
