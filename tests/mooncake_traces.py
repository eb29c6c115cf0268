"""Mooncake-format traces written for tests: rows as JSON lines, and conversations whose turns share prefixes."""
from __future__ import annotations

import json
from pathlib import Path


def write_trace(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_conversations(path: Path, conversations: int, turns: int, gap_ms: int) -> Path:
    """Conversations of growing history: each turn's prompt is the turn before's 512-token blocks plus one of its
    own, the turns `gap_ms` apart (one after another, conversation by conversation)."""
    rows, t = [], 0
    for conv in range(conversations):
        ids = [1000 * conv]
        for turn in range(turns):
            rows.append({"timestamp": t, "input_length": 512 * len(ids), "output_length": 2, "hash_ids": list(ids)})
            ids.append(1000 * conv + turn + 1)
            t += gap_ms
    return write_trace(path, rows)
