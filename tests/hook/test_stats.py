"""Statistics: the torch path (reduced where the tensor lives) equals the numpy path and numpy itself."""

import math

import numpy as np
import pytest
import torch
from trainguard.hook.stats import PERCENTILE_SAMPLE, StatSpec, numpy_stats, torch_stats, unit_reduce_dims

RNG = np.random.default_rng(7)
FULL = StatSpec(percentiles=(5.0, 50.0, 95.0), histogram_bins=16, unit_active=True, unit_band=(-1.0, 1.0))


def reference(a: np.ndarray) -> dict:
    x = a.astype(np.float64)
    return {
        "numel": x.size,
        "mean": x.mean(),
        "std": x.std(),
        "min": x.min(),
        "max": x.max(),
        "mean_abs": np.abs(x).mean(),
        "l1": np.abs(x).sum(),
        "l2": np.sqrt((x * x).sum()),
        "zeros": int((x == 0).sum()),
        "nan": int(np.isnan(x).sum()),
        "inf": int(np.isinf(x).sum()),
    }


def check(stats, ref, rtol=1e-5):
    for key, want in ref.items():
        got = getattr(stats, key)
        assert math.isclose(got, want, rel_tol=rtol, abs_tol=1e-6), (key, got, want)


@pytest.mark.parametrize(
    "shape",
    [(1000,), (64, 32), (8, 16, 5, 5), (4, 7, 11), (3,), (200_000,)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_torch_and_numpy_paths_match_numpy(shape):
    a = (RNG.normal(size=shape) * 3 + 0.5).astype(np.float32)
    a.reshape(-1)[::7] = 0.0
    ref = reference(a)
    t = torch_stats(torch.from_numpy(a), FULL).finalize()
    n = numpy_stats(a, FULL)
    check(t, ref)
    check(n, ref)
    assert t.percentiles is not None and n.percentiles is not None
    assert t.percentiles.keys() == {"5", "50", "95"}
    for k in t.percentiles:
        assert math.isclose(t.percentiles[k], n.percentiles[k], rel_tol=1e-6, abs_tol=1e-6)
    if a.size <= PERCENTILE_SAMPLE:  # exact below the sample size
        assert np.allclose(
            [t.percentiles[k] for k in ("5", "50", "95")], np.percentile(a, [5, 50, 95]), rtol=1e-5
        )
    assert t.histogram == n.histogram
    assert sum(t.histogram.counts) == a.size
    assert t.unit_active == n.unit_active
    assert t.unit_in_band == n.unit_in_band
    if len(shape) >= 2:
        assert t.samples == shape[0]


@pytest.mark.parametrize("with_nan", [False, True])
def test_accelerator_code_path_matches(with_nan):
    """The path used on a GPU (device-side counts, host copy deferred to the writer), run on the CPU."""
    a = (RNG.normal(size=(32, 16)) * 2).astype(np.float32)
    a[0, :3] = 0.0
    if with_nan:
        a[1, 1], a[2, 2] = np.nan, np.inf
    pending = torch_stats(torch.from_numpy(a), FULL, device_path=True)
    assert isinstance(pending.packed, torch.Tensor) and not pending.base  # nothing on the host yet
    t, n = pending.finalize(), numpy_stats(a, FULL)
    assert (t.nan, t.inf, t.zeros, t.numel) == (n.nan, n.inf, n.zeros, n.numel)
    if not with_nan:
        check(t, reference(a))
        assert t.unit_active == n.unit_active and t.percentiles.keys() == n.percentiles.keys()


def test_per_unit_activity_dense_and_conv():
    dense = np.zeros((10, 4), np.float32)
    dense[:3, 0] = 1.0  # unit 0 active in 3 of 10 samples
    dense[:, 1] = 2.0  # unit 1 always active
    s = torch_stats(torch.from_numpy(dense), StatSpec(unit_active=True)).finalize()
    assert s.unit_active == [0.3, 1.0, 0.0, 0.0]
    conv = np.zeros((2, 3, 4, 4), np.float32)
    conv[:, 1] = 1.0
    conv[0, 2, 0, 0] = 5.0
    s = torch_stats(torch.from_numpy(conv), StatSpec(unit_active=True)).finalize()
    assert s.unit_active == [0.0, 1.0, round(1 / 32, 5)]
    assert numpy_stats(conv, StatSpec(unit_active=True)).unit_active == s.unit_active
    assert unit_reduce_dims((8,)) is None


def test_band_fraction_for_saturation():
    x = np.array([[-30.0, 0.0], [0.0, 20.0], [0.0, 0.0], [10.0, 0.0]], np.float32)
    spec = StatSpec(unit_band=(-23.0, 16.99999))
    s = torch_stats(torch.from_numpy(x), spec).finalize()
    assert s.unit_in_band == [0.75, 0.75]
    assert s.band == (-23.0, 16.99999)


def test_nan_inf_counted_like_numpy():
    a = np.array([1.0, np.nan, np.inf, 0.0, -2.0, np.nan], np.float32)
    for s in (torch_stats(torch.from_numpy(a)).finalize(), numpy_stats(a)):
        assert (s.nan, s.inf, s.zeros, s.numel) == (2, 1, 1, 6)
        assert math.isnan(s.mean)
    inf_only = np.array([1.0, np.inf], np.float32)
    s = torch_stats(torch.from_numpy(inf_only)).finalize()
    assert (s.nan, s.inf) == (0, 1) and s.mean == math.inf


def test_large_mean_small_spread_is_exact():
    a = (1000.0 + RNG.normal(size=5000) * 1e-3).astype(np.float32)
    s = torch_stats(torch.from_numpy(a)).finalize()
    assert math.isclose(s.std, a.astype(np.float64).std(), rel_tol=1e-6)


@pytest.mark.parametrize(
    "value",
    [
        np.array(3.5, np.float32),
        np.zeros((0, 4), np.float32),
        np.array([True, False, True]),
        np.arange(-5, 5, dtype=np.int64),
        np.array([1.5, -2.25, 0.0], np.float16),
    ],
    ids=["0-d", "empty", "bool", "int64", "float16"],
)
def test_edge_dtypes_and_shapes(value):
    t = torch_stats(torch.from_numpy(value)).finalize()
    n = numpy_stats(value)
    if value.size == 0:
        assert t.numel == n.numel == 0 and t.mean == 0.0 and t.nan == 0
        return
    ref = reference(value.astype(np.float64))
    check(t, ref)
    check(n, ref)


def test_bfloat16_reduced_in_float32():
    x = torch.tensor([1.0, -2.0, 0.5, 0.0], dtype=torch.bfloat16)
    s = torch_stats(x).finalize()
    check(s, reference(np.array([1.0, -2.0, 0.5, 0.0])))


def test_values_and_value_counts():
    labels = np.array([0, 1, 1, 2], np.int64)
    s = torch_stats(torch.from_numpy(labels), StatSpec(values=True)).finalize()
    assert s.values == [0.0, 1.0, 1.0, 2.0]
    tokens = np.zeros(10_000, np.int64)
    tokens[:2500] = 7
    for s in (
        torch_stats(torch.from_numpy(tokens), StatSpec(value_counts=True)).finalize(),
        numpy_stats(tokens, StatSpec(value_counts=True)),
    ):
        assert s.values is None
        assert s.value_counts == {"0": 7500, "7": 2500}
    # float inputs: no counts
    assert numpy_stats(np.ones(5000, np.float32), StatSpec(value_counts=True)).value_counts is None


def test_complex_rejected_clearly():
    with pytest.raises(TypeError, match="cannot compute statistics"):
        torch_stats(torch.zeros(3, dtype=torch.complex64))
    with pytest.raises(TypeError, match="cannot compute statistics"):
        numpy_stats(np.zeros(3, np.complex64))


@pytest.mark.parametrize("device_path", [False, True])
def test_only_the_fields_asked_for_are_computed(device_path):
    a = (RNG.normal(size=(64, 32)) * 2).astype(np.float32)
    a[0, 0] = 0.0
    spec = StatSpec.of([], ["numel", "mean_abs", "nan", "inf"])
    got = torch_stats(torch.from_numpy(a), spec, device_path=device_path).finalize()
    want = reference(a)
    assert got.numel == a.size and got.mean_abs == pytest.approx(want["mean_abs"], rel=1e-5)
    assert (got.nan, got.inf) == (0, 0)
    assert got.mean is None and got.std is None and got.min is None and got.zeros is None
    np_got = numpy_stats(a, spec)
    assert np_got.mean is None and np_got.mean_abs == pytest.approx(got.mean_abs, rel=1e-6)


def test_non_finite_counts_come_from_the_sums_when_nothing_else_is_asked():
    a = np.ones(100, np.float32)
    a[[3, 7]] = np.nan
    a[9] = np.inf
    spec = StatSpec.of([], ["nan", "inf"])
    for got in (torch_stats(torch.from_numpy(a), spec).finalize(), numpy_stats(a, spec)):
        assert (got.nan, got.inf, got.mean) == (2, 1, None)


def test_many_tensors_at_once_match_one_at_a_time():
    """The batched path (``_foreach_norm`` on an accelerator), run on the CPU."""
    from trainguard.hook.stats import torch_stats_many

    tensors = [
        torch.from_numpy((RNG.normal(size=s) * 3).astype(np.float32)) for s in ((8, 8), (5,), (3, 4, 2))
    ]
    tensors[1][2] = float("nan")
    spec = StatSpec.of([], ["numel", "mean_abs", "l2", "nan", "inf"])
    full = StatSpec()
    batched = torch_stats_many([*tensors, tensors[0]], [spec, spec, spec, full], device_path=True)
    assert batched[0].packed_names == ("l1", "l2", "nan", "inf")  # the foreach group
    for t, pending in zip(tensors, batched[:3], strict=True):
        got, want = pending.finalize(), numpy_stats(t.numpy(), spec)
        assert (got.numel, got.nan, got.inf) == (want.numel, want.nan, want.inf)
        if want.nan == 0:
            assert got.mean_abs == pytest.approx(want.mean_abs, rel=1e-5)
            assert got.l2 == pytest.approx(want.l2, rel=1e-5)
    assert batched[3].finalize().std == pytest.approx(float(tensors[0].double().std(correction=0)), rel=1e-5)
    assert torch_stats_many([tensors[0]], [None]) == [None]
    # the CPU's batched path: one host copy for the group
    for t, pending in zip(tensors, torch_stats_many(tensors, [spec] * 3), strict=True):
        got, want = pending.finalize(), numpy_stats(t.numpy(), spec)
        assert (got.numel, got.nan, got.inf) == (want.numel, want.nan, want.inf)
        if want.nan == 0:
            assert got.mean_abs == pytest.approx(want.mean_abs, rel=1e-5)
            assert got.l2 == pytest.approx(want.l2, rel=1e-5)


@pytest.mark.parametrize(
    "shape", [(64, 300), (8, 5, 40), (6, 7, 3, 9), (3, 4, 2, 2, 5)], ids=["dense", "seq", "conv", "conv3d"]
)
def test_scratch_passes_match_numpy_across_chunk_boundaries(monkeypatch, shape):
    """|x| sums and per-unit counts go through a bounded scratch buffer, in chunks for big
    tensors: the figures are numpy's whatever the chunking (a chunk smaller than a row or
    a sample falls back to a boolean mask)."""
    import trainguard.hook.stats as stats

    rng = np.random.default_rng(7)
    a = rng.normal(size=shape).astype(np.float32)
    a.reshape(-1)[::17] = 0.0
    a.reshape(-1)[5] = np.nan
    spec = StatSpec(unit_active=True, unit_band=(-0.5, 0.5))
    expected = numpy_stats(a, spec)
    for limit in (1 << 20, 64, 37, 5):
        monkeypatch.setattr(stats, "SCRATCH_ELEMENTS", limit)
        stats._scratch.__dict__.clear()
        got = torch_stats(torch.from_numpy(a.copy()), spec).finalize()
        assert got.unit_active == expected.unit_active, limit
        assert got.unit_in_band == expected.unit_in_band, limit
        assert got.nan == 1 and got.zeros == expected.zeros, limit
        finite = torch_stats(torch.from_numpy(np.nan_to_num(a)), StatSpec()).finalize()
        assert finite.l1 == pytest.approx(float(np.abs(np.nan_to_num(a)).astype(np.float64).sum()), rel=1e-5)
        assert finite.zeros == int((np.nan_to_num(a) == 0).sum())
        assert all(b.numel() <= limit for b in stats._scratch.buffers.values())
