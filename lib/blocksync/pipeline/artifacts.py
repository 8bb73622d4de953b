"""Run-directory artifacts: the model (safetensors + model.json), atomic writes, loading back.

A model directory holds `model.safetensors` (weights only: loading never
unpickles code) and `model.json` (model spec, feature columns,
standardization, label mapping, task). `load_model` rebuilds the network from
the registry and returns a `SavedModel` that predicts from raw features the
same way the Spark scoring stage does.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from blocksync.engine.config import ModelSpec
from blocksync.engine.inputs import inputs_of, network_input
from blocksync.engine.models import is_custom
from blocksync.engine.saved_model import network, parse_json, spec_of

if TYPE_CHECKING:
    from blocksync.pipeline.run_files import RunFiles

WEIGHTS = "model.safetensors"
META = "model.json"


def save_model(directory: Path, model: torch.nn.Module, meta: dict[str, Any]) -> None:
    """Write weights and metadata into `directory` (which the caller stages and renames)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(directory / WEIGHTS))
    (directory / META).write_text(json.dumps(meta, indent=1, default=str))


@dataclass
class SavedModel:
    """A trained network with what it needs to score raw features."""

    module: torch.nn.Module
    meta: dict[str, Any]

    @property
    def task(self) -> str:
        return str(self.meta["task"])

    @property
    def labels(self) -> list[Any] | None:
        return self.meta.get("labels")

    def standardize(self, features: np.ndarray) -> np.ndarray:
        x = np.asarray(features, dtype=np.float32)
        if self.meta.get("mean") is None:
            return x
        # float32 input, float64 arithmetic, float32 result: the same operations as the prepare stage in Spark.
        mean = np.asarray(self.meta["mean"], dtype=np.float64)
        std = np.asarray(self.meta["std"], dtype=np.float64)
        return ((x.astype(np.float64) - mean) / std).astype(np.float32)

    def outputs(self, prepared_features: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
        """Network outputs (class probabilities, or the regression value) for already-standardized rows; with
        typed inputs, rows of their packed values (`input_columns.packed_columns`: floats and int64 ids)."""
        with torch.no_grad():
            out = self.module(network_input(inputs_of(self.meta), prepared_features, ids))
            if self.task == "classification":
                return torch.softmax(out, dim=1).numpy().astype(np.float64)
            return out.squeeze(-1).numpy().astype(np.float64)

    def predict(self, raw_features: np.ndarray) -> np.ndarray:
        """Class index (classification) or value (regression) for raw feature rows."""
        out = self.outputs(self.standardize(raw_features))
        return out.argmax(axis=1) if self.task == "classification" else out


def model_meta(spec: ModelSpec, num_features: int, num_outputs: int, prepared: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": "blocksync-model/1",
        "model": asdict(spec),
        "num_features": num_features,
        "num_outputs": num_outputs,
        **{k: prepared.get(k) for k in ("task", "feature_columns", "label_column", "labels", "mean", "std", "inputs")},
    }


def load_model(path: str | Path, *, trust_custom_code: bool = False) -> SavedModel:
    """Load a model directory written by a run (`<run>/model`), or the run directory itself.

    A folder on the driver's disk loads from there. Otherwise, with a classic SparkSession active (a job, a
    notebook), `path` means what it means to Spark's writers (`run_files`: hdfs://, s3a://, dbfs:/ and so on;
    a plain path on the default filesystem), and the model is copied to a temporary folder first.

    Built-in networks (logreg, mlp, cnn) load from weights and JSON alone. A
    network named by an import path `package.module:factory` means importing
    and calling that code, named by a file anyone could have written: it loads
    only with `trust_custom_code=True`.
    """
    from blocksync.pipeline.sources import is_uri

    if not is_uri(str(path)) and Path(path).is_dir():  # a folder on the driver's disk (a /dbfs mount too)
        return _load_directory(Path(path), str(path), trust_custom_code)
    files = _files_of_active_session(path)
    if files is None:
        if is_uri(str(path)):
            raise ValueError(f"{path} is a URI, read through Spark's filesystem: start a SparkSession first, or "
                             "give a folder on this machine's disk.")
        return _load_directory(Path(path), str(path), trust_custom_code)
    return load_model_from(files, trust_custom_code=trust_custom_code)


def load_model_from(files: RunFiles, *, trust_custom_code: bool = False) -> SavedModel:
    """`load_model` for a directory reached through Spark's filesystem layer."""
    if files.local is not None:
        return _load_directory(files.local, files.display(), trust_custom_code)
    name = "model" if files.exists(f"model/{META}") else ""
    if not files.exists(f"{name}/{META}" if name else META):
        raise ValueError(f"{files.display()} holds no blocksync model ({META} and {WEIGHTS}); give a run's model "
                         "directory.")
    with tempfile.TemporaryDirectory(prefix="blocksync-model-") as scratch:
        return _load_directory(files.download(name, Path(scratch) / "model"), files.display(), trust_custom_code)


def _files_of_active_session(path: str | Path) -> RunFiles | None:
    from pyspark.sql import SparkSession

    from blocksync.pipeline.run_files import RunFiles

    spark = SparkSession.getActiveSession()
    if spark is None or getattr(spark, "_jvm", None) is None:  # no session, or Spark Connect
        return None
    return RunFiles(spark, path, setting="model path")


def _load_directory(directory: Path, named: str, trust_custom_code: bool) -> SavedModel:
    if (directory / "model" / META).is_file():
        directory = directory / "model"
    if not (directory / META).is_file() or not (directory / WEIGHTS).is_file():
        raise ValueError(f"{named} holds no blocksync model ({META} and {WEIGHTS}); give a run's model directory.")
    meta = parse_json((directory / META).read_bytes(), str(directory / META))
    spec = spec_of(meta, str(directory / META))
    if is_custom(spec) and not trust_custom_code:
        raise ValueError(
            f"{directory / META} names a custom network {spec.name!r}: loading it imports and runs that code. "
            "If you trust this model directory, call load_model(path, trust_custom_code=True)."
        )
    module = network(meta, (directory / WEIGHTS).read_bytes(), str(directory / META), str(directory / WEIGHTS))
    return SavedModel(module=module, meta=meta)
