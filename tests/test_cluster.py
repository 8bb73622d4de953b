"""Training across process boundaries: a real standalone master and two workers, via spark-submit."""

from __future__ import annotations

import json
from collections.abc import Iterator
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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[StandaloneCluster]:
    """A master + 2 workers (2 cores each), shared by this module's tests: each submits its own application.
    A killed executor is replaced by its worker, so the lost-executor test leaves the cluster whole."""
    cluster = StandaloneCluster(tmp_path_factory.mktemp("standalone"), num_workers=2, cores=2).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def run_job(cluster: StandaloneCluster, tmp_path: Path, job: str) -> dict:
    """Submit tests/jobs/`job` to the cluster; its JSON report."""
    out = tmp_path / "result.json"
    proc = cluster.submit(str(REPO / "tests" / "jobs" / job), str(out), conf=TWO_EXECUTORS, timeout=480)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_four_workers_over_two_executors(cluster, tmp_path):
    report = run_job(cluster, tmp_path, "digits_cluster_job.py")
    assert report["master"] == cluster.url
    assert len(report["task_addresses"]) == 4
    executors = set(report["task_addresses"])
    assert len(executors) == 2, report["task_addresses"]  # two executors, two tasks each
    assert report["accuracy"] >= 0.95, report


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_a_lost_executor_is_replaced_and_training_resumes_identical(cluster, tmp_path):
    report = run_job(cluster, tmp_path, "lost_executor_job.py")
    assert report["resumed_at"] == [10] * 4, report  # every rank restarted from the step-10 checkpoint
    assert report["max_param_diff"] == 0.0, report
    assert report["faulty_history"] == report["clean_history"]
    # The killed executor's replacement ran part of the relaunched stage.
    assert set(report["faulty_addresses"]) - set(report["clean_addresses"]), report
