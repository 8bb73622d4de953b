"""The GPU path without GPUs: a fake discovery script on a standalone cluster gives each task its own address;
with no CUDA the worker falls back to the CPU and says so, or fails saying why when CUDA was demanded."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tests.standalone import StandaloneCluster

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_fake_gpus_one_per_task_and_cpu_fallback(tmp_path):
    script = tmp_path / "gpus.sh"
    script.write_text('#!/usr/bin/env bash\necho \'{"name": "gpu", "addresses": ["0", "1", "2", "3"]}\'\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    opts = f"-Dspark.worker.resource.gpu.amount=4 -Dspark.worker.resource.gpu.discoveryScript={script}"
    cluster = StandaloneCluster(tmp_path, num_workers=1, cores=4, memory="3g", worker_opts=opts).start()
    try:
        out = tmp_path / "gpu.json"
        proc = cluster.submit(
            str(REPO / "tests" / "jobs" / "gpu_discovery_job.py"), str(out),
            conf={
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.executor.cores": "4",
                "spark.executor.memory": "2g",
                "spark.executor.resource.gpu.amount": "4",
                "spark.executor.resource.gpu.discoveryScript": str(script),
                "spark.task.resource.gpu.amount": "1",
                "spark.ui.enabled": "false",
            },
            timeout=480,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = json.loads(out.read_text())
    finally:
        cluster.stop()
    assert len(report["executors"]) == 1
    assert sorted(g for gpus in report["gpus"] for g in gpus) == ["0", "1", "2", "3"]  # one distinct GPU per task
    assert report["devices"] == ["cpu"] * 4  # this torch has no CUDA
    assert all(w and "CUDA is unavailable; training on CPU" in w for w in report["warnings"])
    assert "device='cuda' was requested but CUDA is not available" in report["demanded_cuda"]
