"""The stages users run: prepare, train, evaluate, and run (all three), over one run directory.

Layout of a run directory (see README):

    prepared/{train,test}.parquet, prepared/prepare.json
    model/model.safetensors, model/model.json
    metrics.json  history.jsonl  steps.parquet  timeline.json  report.png  predictions.parquet

Writes are atomic: `run` builds the whole directory beside the target and
renames it into place at the end; the single stages stage their files in a
hidden folder and rename each into place. A failed stage leaves no half-written
model. Existing results are replaced only with `overwrite=True`.
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from blocksync.engine.inputs import InputSpec
from blocksync.engine.launcher import TrainResult, train, train_files
from blocksync.engine.losses import import_loss
from blocksync.engine.models import check_importable
from blocksync.pipeline.artifacts import load_model, model_meta, move_into_place, save_model, write_json_atomic
from blocksync.pipeline.evaluate import metrics as evaluation_metrics
from blocksync.pipeline.evaluate import score
from blocksync.pipeline.prepare import prepare
from blocksync.pipeline.report import plot_report, steps_frame, timeline, write_history
from blocksync.pipeline.run_config import RunConfig, config_to_dict
from blocksync.pipeline.session import warm_python_daemon

log = logging.getLogger(__name__)

TRAIN_ARTIFACTS = ("model", "history.jsonl", "steps.parquet", "timeline.json", "metrics.json")


class _Staging:
    """A hidden folder inside `run_dir` whose entries are renamed into place on success."""

    def __init__(self, run_dir: Path, stage: str) -> None:
        self.run_dir = run_dir
        self.path = run_dir / f".staging-{stage}-{uuid.uuid4().hex[:8]}"

    def __enter__(self) -> Path:
        self.path.mkdir(parents=True)
        return self.path

    def commit(self, names: tuple[str, ...] | list[str], overwrite: bool) -> None:
        for name in names:
            if (self.path / name).exists():
                move_into_place(self.path / name, self.run_dir / name, overwrite=overwrite)

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _require(path: Path, what: str, hint: str) -> None:
    if not path.exists():
        raise ValueError(f"{path} not found: {what}; {hint}")


def _refuse_existing(path: Path, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; pass --overwrite or choose another output_dir.")


def check_settings(config: RunConfig, *, overwrite: bool) -> None:
    """What would otherwise fail late, checked before any Spark work: the output directory, the
    checkpoint store and a custom model's import path. Each error names its setting."""
    check_output_dir(Path(config.output_dir), overwrite=overwrite)
    check_checkpoint_dir(config.train.checkpoint.dir)
    check_importable(config.train.model)
    if config.data.inputs is not None and config.train.blocks == "files":
        raise ValueError("data.inputs with train.blocks=files: typed inputs are cut into blocks by Spark; set "
                         "train.blocks=shuffle (or auto).")
    if config.train.loss:
        import_loss(config.train.loss)


def check_output_dir(target: Path, *, overwrite: bool) -> None:
    if target.exists() and not target.is_dir():
        raise ValueError(f"output_dir={str(target)!r} is a file, not a directory; choose another output_dir.")
    _refuse_existing(target, overwrite)
    ancestor = target.resolve().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"output_dir={str(target)!r}: {ancestor} is a file, so the directory cannot be made there; "
                         "choose another output_dir.")
    try:  # the only reliable test of writability (root passes os.access checks, read-only mounts do not)
        probe = ancestor / f".blocksync-probe-{uuid.uuid4().hex[:8]}"
        probe.mkdir()
        probe.rmdir()
    except OSError as err:
        raise ValueError(f"output_dir={str(target)!r} cannot be written ({ancestor}: {err.strerror}); "
                         "choose a writable output_dir.") from err


def check_checkpoint_dir(uri: str | None) -> None:
    if not uri:
        return
    import pyarrow.fs as pafs

    from blocksync.engine.checkpoint import filesystem

    try:
        fs, root = filesystem(uri)
        info = fs.get_file_info(root)
    except Exception as err:  # pyarrow raises OSError, ValueError or ArrowException subclasses per filesystem
        raise ValueError(f"train.checkpoint.dir={uri!r} cannot be reached ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}); fix the URI or its credentials.") from err
    if info.type == pafs.FileType.File:
        raise ValueError(f"train.checkpoint.dir={uri!r} is a file, not a directory; choose another checkpoint.dir.")


def prepare_stage(spark: SparkSession, config: RunConfig, run_dir: Path, *, overwrite: bool = False) -> dict[str, Any]:
    _refuse_existing(run_dir / "prepared", overwrite)
    run_dir.mkdir(parents=True, exist_ok=True)
    stage = _Staging(run_dir, "prepare")
    with stage as tmp:
        meta = prepare(spark, config, tmp)
        stage.commit(["prepared"], overwrite)
    return meta


def train_stage(
    spark: SparkSession, config: RunConfig, run_dir: Path, *, overwrite: bool = False
) -> TrainResult:
    prepared = run_dir / "prepared"
    _require(prepared / "prepare.json", "the train stage reads prepared data", "run `blocksync prepare` first.")
    _refuse_existing(run_dir / "model", overwrite)
    prep_meta = json.loads((prepared / "prepare.json").read_text())
    progress = "bar" if config.progress else "log"
    train_path = str(prepared / "train.parquet")
    weight = "weight" if prep_meta.get("weight_column") else None  # prepare's name for data.weight
    if prep_meta.get("inputs"):  # measured by prepare: training checks the split against those cardinalities
        result = train(spark, spark.read.parquet(train_path), config.train, label="label", progress=progress,
                       weight=weight, inputs=InputSpec.from_dicts(prep_meta["inputs"]).inputs)
    elif config.train.blocks == "files":
        result = train_files(spark, train_path, config.train, features="features", label="label", progress=progress,
                             weight=weight)
    else:
        result = train(spark, spark.read.parquet(train_path), config.train, features="features", label="label",
                       progress=progress, weight=weight)
    stage = _Staging(run_dir, "train")
    with stage as tmp:
        save_model(tmp / "model", result.model,
                   model_meta(config.train.model, result.num_features, result.num_outputs,
                              {**prep_meta, "inputs": result.inputs.to_dicts() if result.inputs else None}))
        write_history(tmp / "history.jsonl", result.history)
        steps = steps_frame(result.rank_summaries)
        steps.to_parquet(tmp / "steps.parquet", index=False)
        (tmp / "timeline.json").write_text(json.dumps(timeline(steps)))
        metrics = {**result.metrics, "block_sizes": result.block_sizes, "config": config_to_dict(config)}
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=1, default=str))
        stage.commit(list(TRAIN_ARTIFACTS), overwrite)
    return result


def evaluate_stage(spark: SparkSession, config: RunConfig, run_dir: Path) -> dict[str, Any]:
    """Score the test split on the executors; merge the metrics into metrics.json; draw report.png."""
    _require(run_dir / "model", "the evaluate stage needs a trained model", "run `blocksync train` first.")
    # This run trained the model from the user's own config, custom network included.
    saved = load_model(run_dir / "model", trust_custom_code=True)
    test_df = spark.read.parquet(str(run_dir / "prepared" / "test.parquet"))
    scored = score(spark, test_df, saved)
    stage = _Staging(run_dir, "evaluate")
    with stage as tmp:
        scored.write.parquet(str(tmp / "predictions.parquet"))
        scored_back = spark.read.parquet(str(tmp / "predictions.parquet"))
        results = evaluation_metrics(scored_back, saved.task)
        stage.commit(["predictions.parquet"], overwrite=True)
    metrics_path = run_dir / "metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
    metrics.update(results)
    write_json_atomic(metrics_path, metrics)
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines() if line]
    import pandas as pd

    plot_report(run_dir / "report.png", history, pd.read_parquet(run_dir / "steps.parquet"), metrics)
    track(config, run_dir, metrics, history)
    return metrics


def track(config: RunConfig, run_dir: Path, metrics: dict[str, Any], history: list[dict[str, Any]]) -> None:
    """Log the finished run to MLflow when `tracking.mlflow`; a tracking failure is a warning, not a lost run."""
    if not config.tracking.mlflow:
        return
    from blocksync.pipeline.tracking import log_run

    try:
        log_run(config, run_dir, metrics, history)
    except Exception as err:  # the run itself is done and written: keep it, say what tracking lost
        log.warning("MLflow tracking failed (tracking.uri=%s): %s: %s; the run is kept in %s",
                    config.tracking.uri, type(err).__name__, str(err).splitlines()[0][:300] if str(err) else "",
                    run_dir)


def run(spark: SparkSession, config: RunConfig, *, overwrite: bool = False) -> dict[str, Any]:
    """prepare + train + evaluate into a fresh run directory, renamed into place at the end."""
    target = Path(config.output_dir)
    check_settings(config, overwrite=overwrite)
    staging = target.with_name(f".{target.name}.partial-{uuid.uuid4().hex[:8]}")
    warm_python_daemon(spark)  # torch is imported on the executors while prepare runs on the JVM
    try:
        prepare_stage(spark, config, staging)
        train_stage(spark, config, staging)
        metrics = evaluate_stage(spark, config, staging)
        move_into_place(staging, target, overwrite=overwrite)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return metrics
