"""Quantisation: no overflow, the stated error bound against the float64 sum, edge cases."""

from __future__ import annotations

import numpy as np
import pytest
from netreduce.sw_driver import quant


def _allreduce(xs, chunk):
    """What the engine does: MAX of the exponents, int32 sum of the quantised values."""
    n = len(xs)
    e = quant.scales(np.maximum.reduce([quant.chunk_exponents(x, chunk) for x in xs]), n)
    qs = np.array([quant.quantize(x, e, chunk) for x in xs], dtype=np.int64)
    s = qs.sum(axis=0)
    assert np.abs(s).max(initial=0) <= 2**31 - 1, "the int32 sum would overflow"
    return quant.dequantize(s.astype(np.int32), e, chunk), e, qs


@pytest.mark.parametrize("world, n, chunk, seed", [
    (2, 10_000, 256, 0), (3, 4097, 1000, 1), (8, 65_536, 16_384, 2), (32, 3001, 7, 3),
    (5, 100, 1000, 4),
])
def test_error_within_bound_of_float64_sum(world, n, chunk, seed):
    rng = np.random.default_rng(seed)
    xs = [(rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 4, n)).astype(np.float32)
          for _ in range(world)]
    y, e, _ = _allreduce(xs, chunk)
    ref = np.sum(np.array(xs, dtype=np.float64), axis=0)
    bound = quant.error_bound(y, e, chunk, world)
    err = np.abs(y.astype(np.float64) - ref)
    assert (err <= bound).all(), float((err / bound).max())
    # the bound is tight to within a small factor, i.e. precision is really used
    assert (err / bound).max() > 0.05


@pytest.mark.parametrize("world", [2, 4, 64, 128, 129, 256, 300])
def test_worst_case_no_overflow(world):
    # every rank at the largest float32 below a power of two, all the same sign: the case where
    # rounding could carry the sum to 2^31 (see the quant module docstring)
    x = np.full(64, np.nextafter(np.float32(2.0), np.float32(0)), dtype=np.float32)
    for sign in (1, -1):
        y, e, qs = _allreduce([sign * x] * world, 64)
        assert world * np.abs(x).max() * 2.0 ** e[0] < 2**31
        assert np.allclose(y, sign * world * x.astype(np.float64), rtol=1e-6)


def test_scale_uses_the_headroom():
    # N * max|x| * 2^e < 2^31 and not a bit more headroom than needed for N <= 128
    for world in (2, 3, 4, 7, 8, 100, 128):
        x = np.array([0.75, -0.3], dtype=np.float32)
        e = quant.scales(quant.chunk_exponents(x, 2), world)[0]
        assert world * 0.75 * 2.0 ** e < 2**31 <= world * 0.75 * 2.0 ** (e + 2)


def test_zero_tiny_and_huge_chunks():
    chunk = 4
    x = np.array([0, 0, 0, 0, 1e-40, -3e-42, 0, 0, 1.5e38, -1e38, 1, 0], dtype=np.float32)
    ex = quant.chunk_exponents(x, chunk)
    assert ex[0] == quant.EXP_ZERO
    y, e, _ = _allreduce([x, x], chunk)
    assert e[0] == 0 and e[1] == 127  # clamped: 2^e stays a normal float32
    assert (y[:4] == 0).all()
    ref = 2 * x.astype(np.float64)
    assert (np.abs(y - ref) <= quant.error_bound(y, e, chunk, 2)).all()
    assert np.isfinite(y).all()
    # a true sum beyond the float32 range comes out as inf (no exception, no wrap-around)
    big = np.array([3e38], dtype=np.float32)
    y, _, _ = _allreduce([big, big], 1)
    assert y[0] == np.inf


def test_round_trip_is_exact_for_representable_values():
    x = np.arange(-500, 500, dtype=np.float32) / 4
    e = quant.scales(quant.chunk_exponents(x, 100), 1)
    assert np.array_equal(quant.dequantize(quant.quantize(x, e, 100), e, 100), x)


def test_nan_and_inf_are_refused_with_the_chunk():
    x = np.ones(100, np.float32)
    x[57] = np.nan
    with pytest.raises(ValueError, match="chunk 5 .elements 50..59"):
        quant.chunk_exponents(x, 10)
    x[57] = np.inf
    with pytest.raises(ValueError, match="NaN or infinity"):
        quant.chunk_exponents(x, 10)


def test_argument_errors():
    with pytest.raises(TypeError, match="float32"):
        quant.chunk_exponents(np.ones(4), 2)
    with pytest.raises(ValueError, match="one exponent per chunk"):
        quant.quantize(np.ones(10, np.float32), np.zeros(2, np.int32), 4)
    with pytest.raises(TypeError, match="int32"):
        quant.dequantize(np.ones(4, np.int64), np.zeros(1, np.int32), 4)
    with pytest.raises(ValueError, match="chunk"):
        quant.chunk_exponents(np.ones(4, np.float32), 0)
