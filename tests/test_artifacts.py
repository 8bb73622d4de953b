"""Model directories: a custom network loads only when the caller trusts the directory; tracking failures keep runs."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest
import torch

from blocksync import ModelSpec
from blocksync.engine.models import build_model
from blocksync.pipeline.artifacts import load_model, model_meta, save_model

CUSTOM = ModelSpec(name="tests.custom_models:tiny_net", options={"width": 5})
PREPARED = {"task": "classification", "feature_columns": ["a", "b", "c"], "label_column": "y", "labels": [0, 1],
            "mean": [0.0] * 3, "std": [1.0] * 3}


def saved(directory, spec: ModelSpec):
    torch.manual_seed(0)
    module = build_model(spec, 3, 2)
    save_model(directory, module, model_meta(spec, 3, 2, PREPARED))
    return module


def test_a_custom_network_needs_trust_to_load(tmp_path, monkeypatch):
    module = saved(tmp_path / "model", CUSTOM)
    imported = []
    import tests.custom_models as factories

    monkeypatch.setattr(factories, "tiny_net", lambda *a, **k: imported.append(a) or module)
    with pytest.raises(ValueError, match=r"names a custom network 'tests.custom_models:tiny_net': loading it imports "
                                         r"and runs that code. If you trust this model directory, call "
                                         r"load_model\(path, trust_custom_code=True\)"):
        load_model(tmp_path)
    assert imported == []  # refused before the factory ran
    model = load_model(tmp_path, trust_custom_code=True)
    assert imported == [(3, 2)]
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    np.testing.assert_array_equal(model.predict(x), module(torch.from_numpy(x)).argmax(1).numpy())


def test_a_builtin_network_loads_without_trust(tmp_path):
    module = saved(tmp_path, ModelSpec(name="mlp", hidden=[4]))
    x = np.ones((2, 3), dtype=np.float32)
    np.testing.assert_array_equal(load_model(tmp_path).outputs(x),
                                  torch.softmax(module(torch.from_numpy(x)), 1).detach().numpy())


def test_an_unreachable_tracking_server_keeps_the_run(spark, tmp_path, monkeypatch, caplog):
    from blocksync.pipeline.run_config import load_config
    from blocksync.pipeline.run_files import RunFiles
    from blocksync.pipeline.stages import track

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    config = load_config(None, [f"output_dir={tmp_path}", "tracking.mlflow=true", "tracking.uri=http://127.0.0.1:9"])
    (tmp_path / "metrics.json").write_text("{}")
    with caplog.at_level(logging.WARNING, logger="blocksync.pipeline.stages"):
        track(config, RunFiles(spark, tmp_path), {"test_accuracy": 0.5}, [{"epoch": 1, "train_loss": 1.0}])
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("MLflow tracking failed (tracking.uri=http://127.0.0.1:9)")
    assert f"the run is kept in {tmp_path}" in warning
    assert (tmp_path / "metrics.json").read_text() == "{}"


def test_checkpoint_locations_keep_their_filesystem(tmp_path):
    """A resumed rank on another host opens the location it is given: it must still name the object store."""
    from blocksync.engine.checkpoint import child

    assert child("s3://bucket/ckpt/", "step-000000010") == "s3://bucket/ckpt/step-000000010"
    assert (child("s3://b/ckpt?endpoint_override=10.0.0.1:9000&scheme=http", "step-000000010")
            == "s3://b/ckpt/step-000000010?endpoint_override=10.0.0.1:9000&scheme=http")
    assert child(str(tmp_path / "x" / ".." / "c"), "step-1") == str(tmp_path / "c" / "step-1")


def test_run_files_write_rename_and_restore_like_a_filesystem(spark, tmp_path, monkeypatch):
    from blocksync.pipeline.run_files import RunFiles

    monkeypatch.chdir(tmp_path)  # a plain relative path is the driver's working directory's, not the JVM's
    files = RunFiles(spark, "runs/one")
    assert files.local == tmp_path / "runs" / "one" and files.uri().startswith("file:/")
    files.mkdirs()
    files.write_text("staged/metrics.json", '{"a": 1}')
    (tmp_path / "made").mkdir()
    (tmp_path / "made" / "w.bin").write_bytes(b"\x00\x01")
    files.upload(tmp_path / "made", "staged/model")
    files.move_into_place("staged", "result", overwrite=False)
    assert files.read_text("result/metrics.json") == '{"a": 1}'
    assert (tmp_path / "runs" / "one" / "result" / "model" / "w.bin").read_bytes() == b"\x00\x01"
    assert not [p for p in (tmp_path / "runs").rglob("*.crc")]  # no checksum files beside the driver's
    files.write_text("again/metrics.json", "{}")
    with pytest.raises(FileExistsError, match=r"runs/one/result already exists; pass --overwrite"):
        files.move_into_place("again", "result", overwrite=False)
    # A replacement that fails half-way puts the previous results back.
    with pytest.raises(OSError, match="failed"):
        files.move_into_place("missing", "result", overwrite=True)
    assert files.read_text("result/metrics.json") == '{"a": 1}'
    assert sorted(p.name for p in (tmp_path / "runs" / "one").iterdir()) == ["again", "result"]
    files.move_into_place("again", "result", overwrite=True)
    assert files.read_text("result/metrics.json") == "{}"
    assert sorted(p.name for p in (tmp_path / "runs" / "one").iterdir()) == ["result"]
    copy = files.download("result", tmp_path / "copy")
    assert (copy / "metrics.json").read_text() == "{}"


def test_a_model_uri_without_a_spark_session_says_what_to_do():
    code = "from blocksync import load_model; load_model('s3a://bucket/runs/one')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "ValueError: s3a://bucket/runs/one is a URI, read through Spark's filesystem: start a SparkSession first, "
        "or give a folder on this machine's disk.")


def test_show_report_without_a_spark_session_says_what_to_do():
    code = "from blocksync.pipeline.notebook import show_report; show_report('runs/local')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "ValueError: show_report reads the run directory through Spark: start a session or pass spark=.")
