"""What a strategy's own state was at each of a request's tokens (Step.policy_values: SGLang's new_token_ratio,
slo-budget's prompt-token budget), for the per-request export, beside the gaps the steps explain (bench/stalls.py)."""
from __future__ import annotations

import numpy as np

from prefillbench.engine.records import RunRecord


def token_policy_values(run: RunRecord) -> list[dict[str, list[float | None]]] | None:
    """Per request (the run's order), each value's name and, for each of its tokens, the value of the step that
    made the token (None where that step carried none: a deployment's transfer, a decode run); None where no step
    of the run carries a value (most strategies, a served run)."""
    steps = run.steps
    names = sorted({name for s in steps for name, _ in s.policy_values})
    if not names:
        return None
    # a token's time is the end of the step that made it (Loop.retire), so each is found among the ends
    ends = np.fromiter((s.end for s in steps), float, len(steps))
    order = np.argsort(ends, kind="stable")
    sorted_ends = ends[order]
    out = []
    for req in run.requests:
        at = np.searchsorted(sorted_ends, np.asarray(req.token_times, float), side="left")
        found = [dict(steps[order[i]].policy_values) if i < len(steps) and sorted_ends[i] == t else {}
                 for i, t in zip(at.tolist(), req.token_times)]
        out.append({name: [v.get(name) for v in found] for name in names})
    return out
