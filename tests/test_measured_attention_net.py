"""The attention and collective curves (sim/measured/attention.py, collectives.py) against Vidur's shipped samples.

Tolerances come from the data, not from the fit: a held-out point's error is bounded by the curve's own error on
the FIT half plus the data's spread, what a model-free read-off of that point from its FIT neighbours misses
(attention.spread, collectives.spread). Medians get twice the spread's median (a held-out point is one draw of that
spread beside the fitted ones), the worst error the spread's worst. The issue's own target, 15% median on held-out
data per curve, is asserted as well, and every curve must beat the sim's flat pricing.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from prefillbench.backends.sim.measured import attention, collectives
from prefillbench.backends.sim.specs import SimConfigError

ISSUE_TARGET = 0.15  # issue 45: operators within 15% of the measured median on held-out data


def _bounds(summary: pd.DataFrame, key: dict) -> tuple[pd.Series, pd.Series]:
    sel = np.ones(len(summary), dtype=bool)
    for k, v in key.items():
        sel &= (summary[k] == v).to_numpy()
    rows = summary[sel]
    return rows[rows["split"] == "fit"].iloc[0], rows[rows["split"] == "test"].iloc[0]


# ---- samples --------------------------------------------------------------------------------------------------------
def test_samples_are_small_and_name_their_source():
    for path, commit in ((attention.SAMPLE, attention.ATTENTION_COMMIT),
                         (collectives.SAMPLE, collectives.VIDUR_COMMIT)):
        assert path.stat().st_size < 100_000
        first = path.read_text().splitlines()[0]
        assert first.startswith("#") and commit in first and "microsoft/vidur" in first


def test_attention_sample_loads_the_grid():
    df = attention.load_frame()
    pre, dec = df[df["kind"] == "prefill"], df[df["kind"] == "decode"]
    assert set(pre["prefill_chunk_size"]) == set(attention.PREFILL_CHUNKS)
    assert set(dec["batch_size"]) == set(attention.DECODE_BATCHES)
    assert set(dec["kv_cache_size"]) == set(attention.DECODE_CONTEXTS)
    assert (pre["batch_size"] == 1).all() and (pre["prefill_chunk_size"] + pre["kv_cache_size"] <= 4096).all()
    assert (df["median_s"] > 0).all()
    # Both halves of the checkerboard span the grid: every value with two or more points is in both.
    for part in (pre, dec):
        fit, test = part[part["split"] == "fit"], part[part["split"] == "test"]
        assert abs(len(fit) - len(test)) <= 1
        for col in ("prefill_chunk_size", "kv_cache_size", "batch_size"):
            counts = part[col].value_counts()
            several = set(counts[counts >= 2].index)
            assert several <= set(fit[col]) and several <= set(test[col])


def test_attention_flops_and_bytes_are_the_sims():
    # The notes' check: a 4,096-token chunk with no context is 2·4096²·128·32 FLOPs (causal, plus the diagonal).
    fl, by, rows, diag = attention.prefill_cost(4096, 0)
    assert fl == pytest.approx(4 * 128 * 32 * 4096 * 4097 / 2) == diag
    assert rows == 32 * 4096
    # Decode: 128 sequences of 2,048 positions read 128·2048·2·4·128·2 bytes of KV (537 MB) plus Q, O and new K/V.
    fl, by = attention.decode_cost(128, 2048)
    kv = 128 * 2048 * 2 * 4 * 128 * 2
    assert kv < by < kv * 1.01 and fl == 4 * 128 * 32 * 128 * 2048


def test_network_sample_sizes_are_bytes_and_the_copy_is_dropped():
    df = collectives.load_frame()
    dgx = df[df["node"].str.endswith("_dgx")]
    assert dgx["size"].max() == 4096 * 8192 * 2  # Vidur's default max_collective_size in fp16 elements, recorded x2
    # h100_pairwise_nvlink/send_recv.csv is a byte-for-byte copy of the A100 one: not kept as an H100 measurement.
    assert not ((df["node"] == "h100_pairwise_nvlink") & (df["collective"] == "send_recv")).any()
    assert set(df["topology"]) <= set(collectives.TOPOLOGIES)


# ---- held-out errors ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def attention_summary():
    return attention.summary(attention.errors(attention.load_frame()))


@pytest.mark.parametrize("kind", ["prefill", "decode"])
def test_attention_held_out_errors(attention_summary, kind):
    fit, test = _bounds(attention_summary, {"kind": kind})
    assert test["median_err"] <= ISSUE_TARGET
    assert test["median_err"] <= fit["median_err"] + 2 * test["spread_median"]
    assert test["worst_err"] <= fit["worst_err"] + test["spread_worst"]
    assert test["median_err"] < test["flat_median_err"] / 3  # the flat roofline is 3-4x too fast here


@pytest.fixture(scope="module")
def collective_summary():
    return collectives.summary(collectives.errors())


def test_every_measured_collective_has_a_curve(collective_summary):
    keys = {(r.gpu, r.collective, r.topology, r.workers) for r in collective_summary.itertuples()}
    assert keys == set(collectives.fitted_curves())


def test_collective_held_out_errors(collective_summary):
    for key, g in collective_summary.groupby(["gpu", "collective", "topology", "workers"]):
        fit, test = _bounds(g, {})
        assert test["median_err"] <= ISSUE_TARGET, key
        assert test["median_err"] <= fit["median_err"] + 2 * test["spread_median"], key
        assert test["worst_err"] <= fit["worst_err"] + test["spread_worst"], key
        if not np.isnan(test["flat_median_err"]):
            assert test["median_err"] < test["flat_median_err"], key


# ---- the curves' shape ----------------------------------------------------------------------------------------------
def test_prefill_efficiency_rises_with_the_chunk_to_the_published_share():
    c = attention.fitted_attention()
    shares = c.prefill_share(np.array([32 * 64, 32 * 512, 32 * 4096, 32 * 10**6]))
    assert np.all(np.diff(shares) > 0) and shares[-1] < c.prefill_eff == attention.FA2_PEAK_SHARE
    assert c.diag_factor > 1  # the profile: a chunk's own causal block costs more per FLOP than its context
    # More context at one chunk costs more, linearly: the profile's shape.
    fl, by, rows, diag = attention.prefill_cost(512, np.array([0, 1024, 2048, 3072]))
    t = c.prefill_seconds(fl, by, attention.A100_FLOPS, attention.A100_MEM_BW, rows, diag)
    assert np.all(np.diff(t) > 0) and np.allclose(np.diff(t, 2), 0, atol=1e-12)


def test_decode_is_bandwidth_bound_at_the_measured_share():
    c = attention.fitted_attention()
    fl, by = attention.decode_cost(128, 4033)
    t = c.decode_seconds(by, fl, attention.A100_FLOPS, attention.A100_MEM_BW)
    assert t == pytest.approx(c.decode_floor_s + by / (c.decode_eff * attention.A100_MEM_BW))
    # Other GPUs: the same shares of their own peaks, so twice the bandwidth halves the streaming part.
    t2 = c.decode_seconds(by, fl, attention.A100_FLOPS, 2 * attention.A100_MEM_BW)
    assert t2 - c.decode_floor_s == pytest.approx((t - c.decode_floor_s) / 2)


def test_all_reduce_is_monotone_in_size():
    sizes = np.geomspace(1, 2**30, 400)
    for (gpu, kind, topo, w), c in collectives.fitted_curves().items():
        t = c.seconds(sizes)
        assert np.all(np.diff(t) >= 0) and np.all(t > 0), (gpu, kind, topo, w)


@pytest.mark.parametrize("gpu", ["a100", "h100"])
def test_all_reduce_on_8_workers_is_slower_than_on_2_where_the_data_says_so(gpu):
    df = collectives.load_frame()
    ar = df[(df["gpu"] == gpu) & (df["collective"] == "all_reduce") & (df["topology"] == "nvlink_dgx")]
    two = ar[ar["num_workers"] == 2].set_index("size")["median_s"]
    eight = ar[ar["num_workers"] == 8].set_index("size")["median_s"]
    c2, c8 = (collectives.collective("all_reduce", w, "nvlink_dgx", gpu) for w in (2, 8))
    # Small messages are latency-bound, and there the data has 2 workers as slow as 8 or slower (A100: ~50 us
    # against ~30 us below 1 MiB). From the size on which every measured 8-worker all-reduce is the slower, read to
    # one octave (the sample's three sizes an octave: where the two cross is known no closer, and the curves, each
    # some 10-30% off near their knee, cross within it), the curves must say so too.
    slower = (eight > two).to_numpy()
    first = next(i for i in range(len(slower)) if slower[i:].all())
    settled = two.index.to_numpy()[first]
    sizes = two.index.to_numpy()[two.index.to_numpy() >= 2 * settled].astype(float)
    assert len(sizes) >= 5
    assert np.all(c8.seconds(sizes) > c2.seconds(sizes))
    assert c8.seconds(2**30) > c2.seconds(2**30)


def test_cross_node_is_far_slower_than_nvlink():
    df = collectives.load_frame()
    ar = df[(df["gpu"] == "a100") & (df["collective"] == "all_reduce") & (df["num_workers"] == 8)]
    big = ar["size"].max()
    measured = (ar[(ar["topology"] == "cross_node") & (ar["size"] == big)]["median_s"].iloc[0]
                / ar[(ar["topology"] == "nvlink_dgx") & (ar["size"] == big)]["median_s"].iloc[0])
    near, far = (collectives.collective("all_reduce", 8, t, "a100") for t in ("nvlink_dgx", "cross_node"))
    assert far.seconds(big) / near.seconds(big) > measured / 2  # "far": as the data (7.8x at 64 MiB), within 2x
    sizes = np.geomspace(2**11, 2**26, 50)
    assert np.all(far.seconds(sizes) > near.seconds(sizes))
    assert collectives.collective("send_recv", 2, "cross_node", "h100").seconds(big) > \
        5 * collectives.collective("send_recv", 2, "nvlink_dgx", "h100").seconds(big)


# ---- collective(): derived kinds, defaults, errors ---------------------------------------------------------------
def test_all_gather_and_all_to_all_derive_from_all_reduce():
    ar = collectives.collective("all_reduce", 8, "nvlink_dgx", "h100")
    for kind in ("all_gather", "all_to_all"):
        c = collectives.collective(kind, 8, "nvlink_dgx", "h100")
        assert c.factor == pytest.approx(ar.factor / 2) == pytest.approx(7 / 8)
        assert (c.latency_s, c.bus_bw, c.small_latency_s, c.small_bus_bw) == \
            (ar.latency_s, ar.bus_bw, ar.small_latency_s, ar.small_bus_bw)
        assert "not measured" in c.source and c.kind == kind
        assert c.seconds(2**26) < ar.seconds(2**26)


def test_collective_defaults_and_unmeasured_worker_counts():
    assert collectives.collective("all_reduce", 8, "nvlink_dgx").gpu == "h100"  # newest profiled
    assert collectives.collective("all_reduce", 8, "cross_node").gpu == "a100"  # the only one across nodes
    c = collectives.collective("all_reduce", 6, "nvlink_dgx", "h100")
    assert c.workers == 6 and c.factor == pytest.approx(2 * 5 / 6) and "6 workers not measured" in c.source
    assert collectives.collective("all_reduce", 1, "nvlink_dgx").seconds(2**20) == 0.0
    with pytest.raises(SimConfigError):
        collectives.collective("broadcast", 2, "nvlink_dgx")
    with pytest.raises(SimConfigError):
        collectives.collective("all_reduce", 2, "infiniband")
    with pytest.raises(SimConfigError):
        collectives.collective("all_reduce", 8, "cross_node", "h100")


def test_sample_frame_refuses_other_shapes():
    raw = pd.DataFrame({**{k: [v] for k, v in attention.SHAPE.items()}, "n_q_head": [32]})
    with pytest.raises(SimConfigError):
        attention.sample_frame(raw)
