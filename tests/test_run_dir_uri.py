"""A run directory given as a URI: Spark's writers and the driver's own files go through one filesystem.

The filesystem here is a real remote one, SFTP to an sshd on 127.0.0.1 (tests/sftp.py), which no local path
reaches: everything the run writes, it writes over the network through Hadoop's FileSystem.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_digits

from blocksync.pipeline.artifacts import load_model
from tests.sftp import SftpServer, unavailable_reason
from tests.test_pipeline import check_run_dir

REPO = Path(__file__).resolve().parent.parent
REASON = unavailable_reason()
pytestmark = [pytest.mark.timeout(900), pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    return subprocess.run([sys.executable, "-m", "blocksync.pipeline.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_run_directory_on_an_sftp_server_matches_a_local_one(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    digits = load_digits()
    table = pd.DataFrame(digits.data.astype(np.float32), columns=[f"pixel_{i}" for i in range(64)])
    table.assign(label=digits.target).to_parquet(served / "digits.parquet")
    (served / "a_file").write_text("not a folder")
    # blocks=shuffle on both sides: with blocks=auto a local run reads its blocks straight from the Parquet
    # files (pyarrow), while sftp:// files, which pyarrow cannot open, are cut by Spark: other blocks, other steps.
    # What is tested is the filesystem, so the runs are short: 2 workers on torch_gloo, 2 epochs.
    settings = ["--config", "conf/local.yaml", "train.epochs=2", "train.num_workers=2", "train.backend=torch_gloo",
                "train.blocks=shuffle", "--quiet"]
    with SftpServer(tmp_path / "sshd") as server:
        sftp_conf = [f"spark.conf.{k}={v}" for k, v in server.spark_conf().items()]
        remote = [*settings, *sftp_conf, f"data.source={server.uri(served / 'digits.parquet')}"]
        proc = cli("run", *remote, f"output_dir={server.uri(served / 'run')}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"report: {server.uri(served / 'run' / 'report.png')}" in proc.stdout
        # Into the same URI again: refused by the filesystem layer, nothing touched.
        before = (served / "run" / "metrics.json").read_bytes()
        again = cli("run", *remote, f"output_dir={server.uri(served / 'run')}")
        assert again.returncode == 2
        assert again.stderr.strip().splitlines()[-1] == (
            f"blocksync: error: {server.uri(served / 'run')} already exists; pass --overwrite or choose another "
            "output_dir.")
        assert (served / "run" / "metrics.json").read_bytes() == before
        # With --overwrite the new run replaces the whole old one (the same seeds: the same model), log included.
        (served / "run" / "left-by-the-old-run").write_text("")
        replaced = cli("run", *remote, f"output_dir={server.uri(served / 'run')}", "--overwrite")
        assert replaced.returncode == 0, replaced.stderr[-3000:]
        assert not (served / "run" / "left-by-the-old-run").exists()
        assert (served / "run" / "spark.log").stat().st_size > 0
        under_a_file = cli("run", *remote, f"output_dir={server.uri(served / 'a_file' / 'run')}")
        assert under_a_file.returncode == 2
        assert "a_file is a file, so the directory cannot be made there" in under_a_file.stderr
        # New rows scored from the remote run into a remote output.
        table.iloc[:200, :].assign(order_id=np.arange(200)).to_parquet(served / "new.parquet")
        scored = cli("predict", "--model", server.uri(served / "run"), "--input", server.uri(served / "new.parquet"),
                     "--output", server.uri(served / "scored.parquet"), "--quiet",
                     *[f"--conf={k}={v}" for k, v in server.spark_conf().items()])
        assert scored.returncode == 0, scored.stderr[-3000:]
    # The files went over SSH: the server logged the client's logins, and no local folder took the URI's name.
    assert "Accepted publickey" in (tmp_path / "sshd" / "sshd.log").read_text()
    assert not (REPO / "sftp:").exists()
    metrics = check_run_dir(served / "run")  # the layout, as the server stored it
    assert not [p.name for p in served.iterdir() if p.name.startswith(".")]  # no staging left behind
    # The same run into a local folder: the same model, bit for bit, and the same test accuracy.
    local = cli("run", *settings, f"data.source={served / 'digits.parquet'}", f"output_dir={tmp_path / 'local'}")
    assert local.returncode == 0, local.stderr[-3000:]
    assert ((served / "run" / "model" / "model.safetensors").read_bytes()
            == (tmp_path / "local" / "model" / "model.safetensors").read_bytes())
    assert metrics["test_accuracy"] == check_run_dir(tmp_path / "local")["test_accuracy"]
    predictions = pd.read_parquet(served / "scored.parquet").sort_values("order_id")
    expected = load_model(tmp_path / "local").predict(table.iloc[:200, :].to_numpy())
    np.testing.assert_array_equal(predictions["prediction"].to_numpy(), expected)
