"""The pipeline users run: CLI and spark-submit end to end, stages, artifacts, progress, model round trip."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyspark
import pytest

from blocksync import ModelSpec, TrainConfig, train
from blocksync.pipeline.artifacts import load_model
from blocksync.pipeline.prepare import apply_standardization
from blocksync.pipeline.run_config import load_config
from blocksync.pipeline.stages import evaluate_stage, prepare_stage, run, train_stage
from tests.conftest import synthetic_classification

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(400)

LAYOUT = ["model/model.safetensors", "model/model.json", "metrics.json", "history.jsonl", "steps.parquet",
          "report.png", "timeline.json", "predictions.parquet", "prepared/prepare.json",
          "prepared/train.parquet", "prepared/test.parquet"]
METRIC_KEYS = ["test_accuracy", "test_loss", "train_loss", "epochs", "steps", "num_workers", "backend",
               "compression", "samples_per_sec", "sync_fraction", "bytes_sent"]


def check_run_dir(run_dir: Path) -> dict:
    for name in LAYOUT:
        assert (run_dir / name).exists(), name
    assert not [p.name for p in run_dir.iterdir() if p.name.startswith(".staging")]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert set(METRIC_KEYS) <= set(metrics), set(METRIC_KEYS) - set(metrics)
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert len(history) == metrics["epochs"]
    steps = pd.read_parquet(run_dir / "steps.parquet")
    assert len(steps) == metrics["steps"] * metrics["num_workers"]
    assert set(steps.columns) == {"rank", "step", "start", "data", "compute", "sync", "optimizer"}
    trace = json.loads((run_dir / "timeline.json").read_text())
    assert {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"} == {"data", "compute", "sync", "optimizer"}
    meta = json.loads((run_dir / "model" / "model.json").read_text())
    assert meta["labels"] == list(range(10)) and len(meta["mean"]) == 64
    check_startup_phases(metrics["startup_phases"], metrics["num_workers"])
    return metrics


def check_startup_phases(phases: dict, num_workers: int) -> None:
    """The slowest rank's phases are non-negative and add up to its time from launch to first step."""
    names = ["spawn_s", "imports_s", "load_s", "rendezvous_s", "init_s", "first_step_s"]
    assert set(phases) == {*names, "launch_to_first_step_s", "rank"}
    assert 0 <= phases["rank"] < num_workers
    assert all(phases[n] >= 0 for n in names), phases
    assert phases["rendezvous_s"] > 0 and phases["first_step_s"] > 0, phases
    assert sum(phases[n] for n in names) == pytest.approx(phases["launch_to_first_step_s"], abs=1e-3)


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    return subprocess.run([sys.executable, "-m", "blocksync.pipeline.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_cli_run_local_yaml_end_to_end(tmp_path):
    out = tmp_path / "run"
    proc = cli("run", "--config", "conf/local.yaml", f"output_dir={out}", "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = check_run_dir(out)
    assert metrics["test_accuracy"] >= 0.95, metrics["test_accuracy"]
    assert metrics["backend"] == "horovod" and metrics["num_workers"] == 4
    assert f"test accuracy {metrics['test_accuracy']:.4f}" in proc.stdout
    assert f"report: {out / 'report.png'}" in proc.stdout
    # A second run into the same directory is refused, and nothing is touched.
    before = (out / "metrics.json").read_bytes()
    again = cli("run", "--config", "conf/local.yaml", f"output_dir={out}", "--quiet")
    assert again.returncode == 2
    assert again.stderr.strip().splitlines()[-1] == (
        f"blocksync: error: {out} already exists; pass --overwrite or choose another output_dir."
    )
    assert (out / "metrics.json").read_bytes() == before
    # New, unlabeled data: scored on the executors from the raw pixel columns, ids kept.
    from sklearn.datasets import load_digits

    pixels = load_digits().data[:300]
    raw = pd.DataFrame(pixels, columns=[f"pixel_{i}" for i in range(64)]).assign(order_id=np.arange(300) + 1000)
    raw.to_parquet(tmp_path / "new.parquet")
    scored_path = tmp_path / "scored.parquet"
    proc = cli("predict", "--model", str(out), "--input", str(tmp_path / "new.parquet"), "--output",
               str(scored_path), "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == f"scored 300 rows into {scored_path}"
    scored = pd.read_parquet(scored_path).sort_values("order_id")
    assert list(scored.columns) == [*raw.columns, "prediction", "probability"]
    # The reference: the saved model on the driver (numpy standardization, one torch forward pass).
    np.testing.assert_array_equal(scored["prediction"].to_numpy(), load_model(out).predict(pixels.astype(np.float32)))
    again = cli("predict", "--model", str(out), "--input", str(tmp_path / "new.parquet"), "--output",
                str(scored_path), "--quiet")
    assert again.returncode == 2
    assert again.stderr.strip().splitlines()[-1] == (
        f"blocksync: error: --output {scored_path} already exists; pass --overwrite or choose another path.")


def test_spark_submit_pipeline_job_gives_the_same_layout(tmp_path):
    out = tmp_path / "submitted"
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [str(submit), "--master", "local[4]", "--conf", "spark.driver.host=127.0.0.1",
         "jobs/pipeline.py", "--config", "conf/local.yaml", f"output_dir={out}", "train.epochs=20", "--quiet"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = check_run_dir(out)
    assert metrics["epochs"] == 20 and metrics["test_accuracy"] >= 0.95


def test_stages_one_by_one_and_model_round_trip(spark, tmp_path):
    config = load_config(REPO / "conf" / "local.yaml",
                         [f"output_dir={tmp_path}", "train.epochs=5", "train.backend=torch_gloo", "progress=false"])
    run_dir = tmp_path
    meta = prepare_stage(spark, config, run_dir)
    assert meta["rows"]["train"] + meta["rows"]["test"] == 1797
    with pytest.raises(FileExistsError, match=r"prepared already exists; pass --overwrite"):
        prepare_stage(spark, config, run_dir)
    train_stage(spark, config, run_dir)
    metrics = evaluate_stage(spark, config, run_dir)
    # The seeded run (split seed 42, train seed 0, 5 epochs on 4 torch_gloo workers, conf/local.yaml's lr,
    # weight_decay and label_smoothing) classifies 332 of the 341 test rows right (0.9736); the band allows 3
    # rows either way for floating-point noise across machines.
    assert meta["rows"]["test"] == 341
    assert metrics["test_accuracy"] == pytest.approx(332 / 341, abs=3.5 / 341), metrics["test_accuracy"]

    saved = load_model(run_dir)
    test = spark.read.parquet(str(run_dir / "prepared" / "test.parquet")).toPandas()
    spark_pred = spark.read.parquet(str(run_dir / "predictions.parquet")).toPandas()
    x = np.stack(test["features"].to_numpy()).astype(np.float32)
    local_probs = saved.outputs(x)
    # Same rows in the same order (the scoring stage is a narrow map over the test split).
    np.testing.assert_array_equal(spark_pred["label"].to_numpy(), test["label"].to_numpy())
    np.testing.assert_array_equal(np.stack(spark_pred["probability"].to_numpy()), local_probs)
    np.testing.assert_array_equal(spark_pred["prediction"].to_numpy(), local_probs.argmax(1))

    # From raw features: the saved standardization is the prepare stage's, bit for bit.
    raw = np.random.default_rng(0).uniform(0, 16, size=(50, 64)).astype(np.float32)
    raw_df = spark.createDataFrame(pd.DataFrame({"features": list(raw)}))
    prepared = np.stack(apply_standardization(raw_df, meta["mean"], meta["std"]).toPandas()["features"])
    np.testing.assert_array_equal(saved.standardize(raw), prepared.astype(np.float32))
    np.testing.assert_array_equal(saved.predict(raw), saved.outputs(prepared).argmax(1))


def test_regression_on_synthetic_target_reaches_r2_0_9_with_workers_reading_the_files(spark, tmp_path):
    config = load_config(None, [
        f"output_dir={tmp_path / 'reg'}", "progress=false", "data.source=synthetic",
        "data.synthetic.rows=20000", "data.synthetic.features=16", "data.synthetic.noise=0.1",
        "data.synthetic.partitions=4", "train.task=regression", "train.backend=torch_gloo",
        "train.epochs=5", "train.batch_size=256", "train.lr=0.003", "train.model.hidden=[64]",
        "train.blocks=files",  # the workers read the prepared Parquet themselves
    ])
    metrics = run(spark, config)
    assert metrics["test_r2"] >= 0.9, metrics
    prepared = json.loads((tmp_path / "reg" / "prepared" / "prepare.json").read_text())
    assert metrics["config"]["train"]["blocks"] == "files"
    assert sum(metrics["block_sizes"]) == prepared["rows"]["train"]
    assert max(metrics["block_sizes"]) - min(metrics["block_sizes"]) <= 1
    assert metrics["test_rmse"] > 0
    saved = load_model(tmp_path / "reg")
    assert saved.task == "regression" and saved.labels is None


def test_progress_reaches_the_driver_during_the_stage(spark, caplog):
    df = spark.createDataFrame(synthetic_classification(400, 6, 3, seed=1))
    cfg = TrainConfig(num_workers=2, backend="torch_gloo", epochs=3, batch_size=50,
                      model=ModelSpec(name="logreg"))
    with caplog.at_level(logging.INFO, logger="blocksync.engine.progress"):
        train(spark, df, cfg, progress="log")
    lines = [r.getMessage() for r in caplog.records if r.name == "blocksync.engine.progress"]
    assert [line.split()[1] for line in lines] == ["1", "2", "3"]  # one line per epoch, from rank 0
    assert lines[-1].startswith("epoch 3 step 24/24 loss ")


def test_mlflow_tracking_to_a_local_file_store(spark, tmp_path):
    store = tmp_path / "mlruns"
    config = load_config(REPO / "conf" / "local.yaml", [
        f"output_dir={tmp_path / 'tracked'}", "progress=false", "train.epochs=2", "train.backend=torch_gloo",
        "tracking.mlflow=true", f"tracking.uri={store}", "tracking.experiment=blocksync-test",
    ])
    metrics = run(spark, config)
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=store.resolve().as_uri())
    experiment = client.get_experiment_by_name("blocksync-test")
    (logged,) = client.search_runs([experiment.experiment_id])
    assert logged.data.params["train.backend"] == "torch_gloo"
    assert logged.data.metrics["test_accuracy"] == pytest.approx(metrics["test_accuracy"])
    assert [m.step for m in client.get_metric_history(logged.info.run_id, "train_loss")] == [1, 2]
    artifacts = {a.path for a in client.list_artifacts(logged.info.run_id)}
    assert {"model", "report.png", "metrics.json"} <= artifacts


def test_missing_input_path_is_a_clear_error(spark, tmp_path):
    config = load_config(None, [f"output_dir={tmp_path / 'x'}", f"data.source={tmp_path / 'absent.parquet'}"])
    with pytest.raises(ValueError, match=r"data.source='.*absent.parquet' does not exist; check the path."):
        run(spark, config)
    assert not (tmp_path / "x").exists()  # nothing half-written
    assert not list(tmp_path.glob(".x.partial-*"))
