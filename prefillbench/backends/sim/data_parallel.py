"""--dp N on the sim: N data-parallel ranks, each a copy of the --tp layout with its own KV cache and max_num_seqs,
each an engine of its own, stepping in lockstep (prefillbench/engine/lockstep.py says how and why: vLLM's
`DPEngineCoreProc`, SGLang's DP attention).

The lead backend (the one --dp built) stands for the whole deployment in what the commands read of it (its device,
its metadata, N ranks' worth of sequences and KV in `max_concurrency`); each rank's steps run on a backend of its
own, built here once: the same model, GPU, pricing and cache settings at --tp with one rank, so a rank's step is
priced on its own prompt chunks and decodes alone (CostModel.fast_seconds), as one engine's would be, and its KV
held against its own cache.

Not modelled: expert parallelism across the ranks (each rank is priced with its own experts, as with --tp alone;
--ep past --tp, the sim's DP attention on equal shares, is refused beside --dp), pipeline stages, sliding-window
layers, a trace, speculative decoding and a host KV tier beside --dp.
"""

from __future__ import annotations

from prefillbench.backends.sim.specs import SimConfigError


def rank_backends(lead) -> list:
    """The ranks' backends of a SimBackend with --dp N: N copies of its layout, one rank each."""
    return [type(lead)(lead.model, lead.spec_gpu, tp=lead.tp, pp=lead.pp, ep=lead.ep, **lead._settings)
            for _ in range(lead.data_parallel)]


def check_dp(dp: int, *, tp: int, pp: int, ep: int, windows: bool) -> None:
    """One line for each combination --dp does not model."""
    if dp < 1:
        raise SimConfigError(f"--dp must be at least 1, got {dp}")
    if dp == 1:
        return
    if ep > tp:
        raise SimConfigError(f"--dp {dp} with --ep {ep} past --tp {tp}: expert parallelism across data-parallel ranks "
                             "is not modelled beside --dp (each rank is priced with its own experts); drop one")
    if pp > 1:
        raise SimConfigError(f"--dp {dp} with --pp {pp}: pipeline stages are not modelled beside --dp")
    if windows:
        raise SimConfigError(f"--dp {dp}: models with sliding-window layers are not modelled beside --dp")


__all__ = ["check_dp", "rank_backends"]
