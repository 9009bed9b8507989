"""Min/max bucket down-sampling keeps every key column's extremes and whole rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.report.downsample import minmax_rows, thin_monotone


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3000), buckets=st.integers(1, 40), seed=st.integers(0, 2**31))
def test_extremes_survive_and_rows_stay_whole(n: int, buckets: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"t": np.sort(rng.uniform(0, 1e5, n)),
                       "a": rng.integers(0, 2**40, n), "b": rng.integers(0, 100, n)})
    df["c"] = df["a"] + df["b"]
    kept = minmax_rows(df, "t", ["a", "b"], buckets)
    assert kept["a"].max() == df["a"].max() and kept["a"].min() == df["a"].min()
    assert kept["b"].max() == df["b"].max() and kept["b"].min() == df["b"].min()
    assert (kept["c"] == kept["a"] + kept["b"]).all()  # whole rows, never mixed
    assert kept["t"].is_monotonic_increasing
    assert len(kept) <= max(len(df) if len(df) <= 6 * buckets else 0, 6 * buckets)
    assert kept.merge(df, how="left", indicator=True)["_merge"].eq("both").all()


def test_long_series_shrinks_to_bucket_budget() -> None:
    t = np.arange(604_800, dtype=float)  # a week at 1 s
    v = np.zeros_like(t)
    v[123_457] = 7.0  # one spike
    kept = minmax_rows(pd.DataFrame({"t": t, "v": v}), "t", ["v"], buckets=1000)
    assert len(kept) <= 4 * 1000
    assert 123_457.0 in kept["t"].tolist() and kept["v"].max() == 7.0
    assert kept["t"].iloc[0] == 0.0 and kept["t"].iloc[-1] == 604_799.0


def test_thin_monotone_keeps_ends() -> None:
    x = np.arange(10_001, dtype=float)
    xs, ys = thin_monotone(x, x / 10_000, max_points=100)
    assert len(xs) == 100 and xs[0] == 0.0 and xs[-1] == 10_000.0 and ys[-1] == 1.0
    same = thin_monotone(x[:5], x[:5], max_points=100)
    assert list(same[0]) == list(x[:5])
