"""The client's workers as Ray actors (--client-ray): a local Ray cluster, started and shut down by the run, with two
workers sending the slices of one schedule; the one report matches the run sent from one process (issue 60).
Ray is the [ray] extra: `make install` installs it."""
from __future__ import annotations

import json

import pytest
from processes import session_processes

from test_client_scale import stub_server

ARGS = ["run", "--pg", "16,4", "--arrival", "poisson", "--rate", "20", "--requests", "16", "--no-progress",
        "--no-results-file", "--no-verdict"]


def test_two_ray_workers_give_one_report_that_matches_one_process(run_cli, tmp_path):
    with stub_server("--token-ms", "5") as url:
        rows = {}
        for name, flags in (("one", []), ("ray", ["--client-workers", "2", "--client-ray"])):
            export = tmp_path / f"{name}.json"
            code, out, err = run_cli(*ARGS, "--backend", "server", "--url", url, *flags, "--export", str(export))
            assert code == 0, err
            data = json.loads(export.read_text())
            rows[name], meta = data["results"][0], data["metadata"]
    assert meta["client_placement"] == "ray" and meta["client_workers"] == 2
    one, ray = rows["one"], rows["ray"]
    assert ray["client_workers"] == 2 and one["client_workers"] == 1
    assert ray["requests"] == one["requests"] == 16 and ray["failed_requests"] == one["failed_requests"] == 0
    # the same schedule: the same offered rate (its arrivals, to the microsecond), and the stub's 5 ms pace in both
    assert ray["offered_rps"] == pytest.approx(one["offered_rps"], rel=1e-4)
    for row in (one, ray):
        assert 4 <= row["tbt_p50_ms"] < 100 and row["ttft_p50_ms"] > 0
    # the local cluster the run started is gone with it
    assert not session_processes(lambda args: "raylet" in args or "gcs_server" in args)
