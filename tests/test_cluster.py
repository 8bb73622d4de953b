"""Training across process boundaries: a real standalone master and two workers, via spark-submit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.standalone import StandaloneCluster

REPO = Path(__file__).resolve().parent.parent


TWO_EXECUTORS = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.executor.cores": "2",
    "spark.executor.memory": "1g",
    "spark.cores.max": "4",
    "spark.ui.enabled": "false",
}


def run_job(tmp_path: Path, job: str) -> tuple[StandaloneCluster, dict]:
    """Submit tests/jobs/`job` to a fresh master + 2 workers (2 cores each); its JSON report."""
    cluster = StandaloneCluster(tmp_path, num_workers=2, cores=2).start()
    try:
        out = tmp_path / "result.json"
        proc = cluster.submit(str(REPO / "tests" / "jobs" / job), str(out), conf=TWO_EXECUTORS, timeout=480)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return cluster, json.loads(out.read_text())
    finally:
        cluster.stop()


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_four_workers_over_two_executors(tmp_path):
    cluster, report = run_job(tmp_path, "digits_cluster_job.py")
    assert report["master"] == cluster.url
    assert len(report["task_addresses"]) == 4
    executors = set(report["task_addresses"])
    assert len(executors) == 2, report["task_addresses"]  # two executors, two tasks each
    assert report["accuracy"] >= 0.95, report


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_a_lost_executor_is_replaced_and_training_resumes_identical(tmp_path):
    _, report = run_job(tmp_path, "lost_executor_job.py")
    assert report["resumed_at"] == [10] * 4, report  # every rank restarted from the step-10 checkpoint
    assert report["max_param_diff"] == 0.0, report
    assert report["faulty_history"] == report["clean_history"]
    # The killed executor's replacement ran part of the relaunched stage.
    assert set(report["faulty_addresses"]) - set(report["clean_addresses"]), report
