"""The engine on a Spark Connect session (what Databricks shared and serverless compute run).

In its own process: a local Connect server cannot share a process with the classic session fixture.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(400)
def test_train_and_score_on_spark_connect(tmp_path):
    out = tmp_path / "connect.json"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "jobs" / "connect_job.py"), str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=360)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["session"] == "pyspark.sql.connect.session"
    assert report["block_sizes"] == [150, 150, 150, 150]
    assert len(report["digests"]) == 1  # replicas identical
    assert report["accuracy"] >= 0.9
    assert report["files_block_sizes"] == [300, 300] and len(report["files_digests"]) == 1
    # block_storage=disk on Connect: the same replicas, bit for bit, as blocks in memory.
    assert report["files_storage"] == "disk" and report["files_digests"] == report["files_memory_digests"]
    assert "Spark Connect session: no SparkContext on the client" in proc.stderr
    # Spark ML on Connect: fit, transform (every column kept), MLlib evaluator, save and load.
    assert report["ml_columns"] == ["features", "label", "prediction", "rawPrediction", "probability"]
    assert report["ml_accuracy"] >= 0.9 and report["ml_round_trip"] is True
