"""The stages users run: prepare, train, evaluate, and run (all three), over one run directory.

Layout of a run directory (see README):

    prepared/{train,test}.parquet, prepared/prepare.json
    model/model.safetensors, model/model.json
    metrics.json  history.jsonl  steps.parquet  timeline.json  report.png  predictions.parquet

The run directory may be a local path or any URI Spark writes to (`run_files`): Spark's writers and the
driver's own writes go through the same Hadoop filesystem. Writes are atomic per entry: `run` builds the whole
directory beside the target and renames it into place at the end; the single stages stage their entries in a
hidden folder and rename each into place. A failed stage leaves no half-written model. Existing results are
replaced only with `overwrite=True`.
"""

from __future__ import annotations

import io
import json
import logging
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from blocksync.engine.driver.launcher import TrainResult, train, train_files
from blocksync.engine.inputs import InputSpec
from blocksync.pipeline.artifacts import load_model_from, model_meta, save_model
from blocksync.pipeline.checks import check_settings
from blocksync.pipeline.evaluate import metrics as evaluation_metrics
from blocksync.pipeline.evaluate import score
from blocksync.pipeline.leftovers import StagedOutput, claim, sweep
from blocksync.pipeline.outputs import check_output, read_root, refuse_overlap
from blocksync.pipeline.prepare import prepare
from blocksync.pipeline.report import history_lines, plot_report, steps_frame, timeline
from blocksync.pipeline.run_config import RunConfig, config_to_dict
from blocksync.pipeline.run_files import RunFiles
from blocksync.pipeline.session import warm_python_daemon

log = logging.getLogger(__name__)

TRAIN_ARTIFACTS = ("model", "history.jsonl", "steps.parquet", "timeline.json", "metrics.json")
RunDir = str | os.PathLike[str] | RunFiles


class _Staging:
    """A hidden folder inside the run directory, beside a local scratch folder: Spark writes into the first,
    the driver makes its files in the second; `commit` copies those up and renames each entry into place."""

    def __init__(self, files: RunFiles, stage: str) -> None:
        self.files = files
        self.name = f".staging-{stage}-{uuid.uuid4().hex[:8]}"
        self._scratch = tempfile.TemporaryDirectory(prefix=f"blocksync-{stage}-")
        self.local = Path(self._scratch.name)

    def __enter__(self) -> _Staging:
        claim(self.files, self.name)  # signed: a killed driver's leftover is removed by the next stage here
        return self

    def uri(self, name: str) -> str:
        return self.files.uri(f"{self.name}/{name}")

    def write_text(self, name: str, text: str) -> None:
        self.files.write_text(f"{self.name}/{name}", text)

    def commit(self, names: tuple[str, ...] | list[str], overwrite: bool) -> None:
        for name in names:
            if (self.local / name).exists():
                self.files.upload(self.local / name, f"{self.name}/{name}")
        for name in names:
            if self.files.exists(f"{self.name}/{name}"):
                self.files.move_into_place(f"{self.name}/{name}", name, overwrite=overwrite)

    def __exit__(self, *exc: object) -> None:
        self._scratch.cleanup()
        self.files.discard(self.name)


def run_files(spark: SparkSession, run_dir: RunDir) -> RunFiles:
    files = run_dir if isinstance(run_dir, RunFiles) else RunFiles(spark, run_dir)
    _refuse_a_file(files)
    sweep(files)
    return files


def _refuse_a_file(files: RunFiles) -> None:
    if files.is_file():
        raise ValueError(f"output_dir={files.display()!r} is a file, not a directory; choose another output_dir.")


def _require(files: RunFiles, name: str, what: str, hint: str) -> None:
    if not files.exists(name):
        raise ValueError(f"{files.display(name)} not found: {what}; {hint}")


def _refuse_existing(files: RunFiles, name: str, overwrite: bool) -> None:
    if files.exists(name) and not overwrite:
        raise FileExistsError(f"{files.display(name)} already exists; pass --overwrite or choose another output_dir.")


def prepare_stage(spark: SparkSession, config: RunConfig, run_dir: RunDir, *, overwrite: bool = False
                  ) -> dict[str, Any]:
    files = run_files(spark, run_dir)
    _refuse_existing(files, "prepared", overwrite)
    files.mkdirs()
    with _Staging(files, "prepare") as stage:
        meta = prepare(spark, config, stage.uri("prepared"))
        stage.write_text("prepared/prepare.json", json.dumps(meta, indent=1, default=str))
        stage.commit(["prepared"], overwrite)
    return meta


def train_stage(spark: SparkSession, config: RunConfig, run_dir: RunDir, *, overwrite: bool = False
                ) -> TrainResult:
    files = run_files(spark, run_dir)
    _require(files, "prepared/prepare.json", "the train stage reads prepared data", "run `blocksync prepare` first.")
    _refuse_existing(files, "model", overwrite)
    prep_meta = json.loads(files.read_text("prepared/prepare.json"))
    progress = "bar" if config.progress else "log"
    train_path = files.uri("prepared/train.parquet")
    weight = "weight" if prep_meta.get("weight_column") else None  # prepare's name for data.weight
    if prep_meta.get("inputs"):  # measured by prepare: training checks the split against those cardinalities
        result = train(spark, spark.read.parquet(train_path), config.train, label="label", progress=progress,
                       weight=weight, inputs=InputSpec.from_dicts(prep_meta["inputs"]).inputs)
    elif config.train.blocks == "files":  # pyarrow reads it: a plain path where the run directory is local
        local = str(files.local / "prepared" / "train.parquet") if files.local is not None else train_path
        result = train_files(spark, local, config.train, features="features", label="label", progress=progress,
                             weight=weight)
    else:
        result = train(spark, spark.read.parquet(train_path), config.train, features="features", label="label",
                       progress=progress, weight=weight)
    with _Staging(files, "train") as stage:
        save_model(stage.local / "model", result.model,
                   model_meta(config.train.model, result.num_features, result.num_outputs,
                              {**prep_meta, "inputs": result.inputs.to_dicts() if result.inputs else None}))
        stage.write_text("history.jsonl", history_lines(result.history))
        steps = steps_frame(result.rank_summaries)
        steps.to_parquet(stage.local / "steps.parquet", index=False)
        stage.write_text("timeline.json", json.dumps(timeline(steps)))
        metrics = {**result.metrics, "block_sizes": result.block_sizes, "config": config_to_dict(config)}
        stage.write_text("metrics.json", json.dumps(metrics, indent=1, default=str))
        stage.commit(list(TRAIN_ARTIFACTS), overwrite)
    return result


def evaluate_stage(spark: SparkSession, config: RunConfig, run_dir: RunDir) -> dict[str, Any]:
    """Score the test split on the executors; merge the metrics into metrics.json; draw report.png."""
    import pandas as pd

    files = run_files(spark, run_dir)
    _require(files, "model", "the evaluate stage needs a trained model", "run `blocksync train` first.")
    saved = load_model_from(files, trust_custom_code=True)  # the network of this run's own config
    scored = score(spark, spark.read.parquet(files.uri("prepared/test.parquet")), saved)
    metrics = json.loads(files.read_text("metrics.json")) if files.exists("metrics.json") else {}
    with _Staging(files, "evaluate") as stage:
        scored.write.parquet(stage.uri("predictions.parquet"))
        metrics.update(evaluation_metrics(spark.read.parquet(stage.uri("predictions.parquet")), saved.task))
        stage.write_text("metrics.json", json.dumps(metrics, indent=1, default=str))
        history = [json.loads(line) for line in files.read_text("history.jsonl").splitlines() if line]
        steps = pd.read_parquet(io.BytesIO(files.read_bytes("steps.parquet")))
        plot_report(stage.local / "report.png", history, steps, metrics)
        stage.commit(["predictions.parquet", "metrics.json", "report.png"], overwrite=True)
    track(config, files, metrics, history)
    return metrics


def track(config: RunConfig, files: RunFiles, metrics: dict[str, Any], history: list[dict[str, Any]]) -> None:
    """Log the finished run to MLflow when `tracking.mlflow`; a tracking failure is a warning, not a lost run."""
    if not config.tracking.mlflow:
        return
    from blocksync.pipeline.tracking import log_run

    try:
        with tempfile.TemporaryDirectory(prefix="blocksync-track-") as scratch:
            local = files.local if files.local is not None else Path(scratch)
            if files.local is None:  # MLflow logs files from the driver's disk
                for name in ("model", "report.png", "metrics.json", "timeline.json"):
                    files.download(name, local / name)
            log_run(config, local, metrics, history)
    except Exception as err:  # the run itself is done and written: keep it, say what tracking lost
        log.warning("MLflow tracking failed (tracking.uri=%s): %s: %s; the run is kept in %s",
                    config.tracking.uri, type(err).__name__, str(err).splitlines()[0][:300] if str(err) else "",
                    files.display())


def run(spark: SparkSession, config: RunConfig, *, overwrite: bool = False) -> dict[str, Any]:
    """prepare + train + evaluate into a fresh run directory beside the target, renamed into place at the end."""
    check_settings(config)
    target = RunFiles(spark, config.output_dir)
    sweep(target)  # what stopped runs into this output_dir left beside it, when provably dead
    check_output(target, overwrite=overwrite)
    if config.data.source not in ("digits", "synthetic"):
        source = read_root(spark, config.data.source, "data.source")
        refuse_overlap(target, {"data.source": source} if source else {})
    warm_python_daemon(spark)  # torch is imported on the executors while prepare runs on the JVM
    with StagedOutput(target) as staged:
        prepare_stage(spark, config, staged.files)
        train_stage(spark, config, staged.files)
        metrics = evaluate_stage(spark, config, staged.files)
        staged.commit(overwrite=overwrite)
    return metrics
