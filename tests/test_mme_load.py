"""The local MME under locust load with faults injected (tests/reliability/mme_load.py; about 90 s, `make soak`).

What it proves, from the clients' side: a killed stub and a target that kills its stub cost the healthy targets no
request; a tritonserver death costs only the calls that were in it, each answered 503 with Retry-After; SIGTERM under
load answers every call in flight (200, or 503 with Retry-After past the drain deadline) and no client sees a 4xx;
afterwards no process, /dev/shm region or working folder is left. Recovery times are measured, never asserted.
"""

from __future__ import annotations

import pytest

from tests.reliability import mme_load


@pytest.mark.soak
def test_local_mme_loses_only_calls_inside_a_dying_server_when_faults_hit_it_under_load(tmp_path):
    report = mme_load.run(tmp_path / "mme-load")
    print(report.markdown())
    stub_killed, stub_killer, server_killed, server_killer = report.faults
    assert stub_killed.healthy_lost == 0 and stub_killer.healthy_lost == 0, report.markdown()
    assert "quarantined" in stub_killer.behaviour and stub_killer.metrics["ModelQuarantines"] == 1
    for fault in (server_killed, server_killer):
        assert all(reason.startswith("503 tritonserver exited") for reason in fault.lost_reasons), fault
        assert fault.metrics["TritonRestarts"] == 1
    assert all(f.healthy_requests > 0 for f in report.faults)
    shutdown = report.shutdown
    assert shutdown["in_flight_lost"] == 0 and shutdown["answered_4xx"] == 0, shutdown
    assert shutdown["503_without_retry_after"] == 0
    assert shutdown["processes_left"] == [] and shutdown["shm_regions_left"] == [] and not shutdown["workdir_left"]
