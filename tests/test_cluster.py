"""Training across process boundaries: a real standalone master and two workers, via spark-submit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.standalone import StandaloneCluster

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_four_workers_over_two_executors(tmp_path):
    cluster = StandaloneCluster(tmp_path, num_workers=2, cores=2).start()
    try:
        out = tmp_path / "result.json"
        proc = cluster.submit(
            str(REPO / "tests" / "jobs" / "digits_cluster_job.py"), str(out),
            conf={
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.executor.cores": "2",
                "spark.executor.memory": "1g",
                "spark.cores.max": "4",
                "spark.ui.enabled": "false",
            },
            timeout=480,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = json.loads(out.read_text())
    finally:
        cluster.stop()
    assert report["master"] == cluster.url
    assert len(report["task_addresses"]) == 4
    executors = set(report["task_addresses"])
    assert len(executors) == 2, report["task_addresses"]  # two executors, two tasks each
    assert report["accuracy"] >= 0.95, report
