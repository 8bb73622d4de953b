"""Optional MLflow tracking (`tracking.mlflow: true`): parameters, per-epoch metrics, model, report.

The default URI is the local file store `./mlruns`. MLflow 3 keeps that
backend in maintenance mode and refuses it unless MLFLOW_ALLOW_FILE_STORE is
set; for a file URI we set it, since the file store is what this option
promises. Point `tracking.uri` at a server or a database for anything shared.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from blocksync.pipeline.run_config import RunConfig


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value


def log_run(config: RunConfig, run_dir: Path, metrics: dict[str, Any], history: list[dict[str, Any]]) -> str:
    """Log one MLflow run; returns its run id."""
    try:
        import mlflow
    except ImportError as err:
        raise ValueError(
            "tracking.mlflow is true but MLflow is not installed; pip install mlflow-skinny==3.18.0 "
            "(scripts/setup_env.sh installs it) or set tracking.mlflow=false."
        ) from err
    uri = config.tracking.uri
    if "://" not in uri or uri.startswith("file://"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        path = uri.removeprefix("file://")
        uri = Path(path).resolve().as_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(config.tracking.experiment)
    params: dict[str, Any] = {}
    _flatten("", {"train": config.train.to_dict(), "data": {"source": config.data.source}}, params)
    with mlflow.start_run() as active:
        mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
        for entry in history:
            mlflow.log_metrics({k: float(v) for k, v in entry.items() if k not in ("epoch", "step")},
                               step=int(entry["epoch"]))
        per_epoch = {k for entry in history for k in entry}
        mlflow.log_metrics({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))
                            and not isinstance(v, bool) and k not in per_epoch}, step=len(history))
        mlflow.log_artifacts(str(run_dir / "model"), artifact_path="model")
        for name in ("report.png", "metrics.json", "timeline.json"):
            if (run_dir / name).exists():
                mlflow.log_artifact(str(run_dir / name))
        return active.info.run_id
