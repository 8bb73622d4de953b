"""Typed Spark ML Params for every TrainConfig setting users tune, and the column Params.

One Param per top-level `TrainConfig` field (camelCase: `num_workers` is
`numWorkers`), with TrainConfig's own default, so an estimator and `train()`
start from the same settings. Each value is checked when it is set, as
`TrainConfig` checks it (nested settings, `model`, `checkpoint`, `timeouts`,
`horovod`, are dicts of the YAML keys, checked by their dataclass); settings
that do not go together are refused at `fit`, before any Spark job.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasFeaturesCol,
    HasLabelCol,
    HasPredictionCol,
    HasValidationIndicatorCol,
    HasWeightCol,
)

from blocksync.engine.config import CheckpointSettings, HorovodSettings, ModelSpec, TimeoutSettings, TrainConfig


def _dict_of(kind: type) -> Any:
    def convert(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise TypeError(f"expected a dict of {kind.__name__} settings, got {type(value).__name__}")
        kind(**value)  # raises naming the bad key or value
        return dict(value)

    return convert


def _inputs_list(value: Any) -> list[dict[str, Any]]:
    """Typed input specs as plain dicts (what Spark ML's JSON persistence stores), checked."""
    from blocksync.engine.inputs import Input, parse_inputs

    items = [asdict(i) if isinstance(i, Input) else i for i in value]
    parse_inputs([{k: v for k, v in i.items() if k != "width"} if isinstance(i, dict) else i for i in items])
    return [{k: (list(v) if isinstance(v, tuple) else v) for k, v in i.items() if k != "width"} for i in items]


def _optional(convert: Any) -> Any:
    return lambda value: None if value is None else convert(value)


def checked(name: str, key: str, convert: Any) -> Any:
    """`convert`, then the value checked as `TrainConfig` checks it (the other settings at their defaults),
    so a bad value raises when it is set, naming the Param; combinations of settings are checked at `fit`."""
    def check(value: Any) -> Any:
        value = convert(value)
        try:
            TrainConfig(**{key: value})
        except (TypeError, ValueError) as err:
            raise ValueError(f"Param {name}: {err}") from err
        return value

    return check


def one_of(name: str, choices: tuple[str, ...]) -> Any:
    def check(value: Any) -> str:
        value = TypeConverters.toString(value)
        if value not in choices:
            raise ValueError(f"{name}={value!r}: choose one of {list(choices)}.")
        return value

    return check


def at_least_one(name: str) -> Any:
    def check(value: Any) -> int:
        value = TypeConverters.toInt(value)
        if value < 1:
            raise ValueError(f"{name}={value!r}: must be 1 or more.")
        return value

    return check


_INT, _FLOAT, _STR = TypeConverters.toInt, TypeConverters.toFloat, TypeConverters.toString

TRAIN_PARAMS: dict[str, tuple[str, Any, str]] = {
    # Param name: (TrainConfig field, converter, doc)
    "numWorkers": ("num_workers", _INT, "number of blocks and barrier tasks (one rank each)"),
    "backend": ("backend", _STR, "collective: horovod, torch_gloo, spark or auto (chosen before launch)"),
    "blockStorage": ("block_storage", _STR, "where workers keep their block: auto, memory, disk or stream "
                     "(Parquet datasets read from their files, with epochOrder=chunks)"),
    "memoryBudgetMb": ("memory_budget_mb", _INT, "with blockStorage=disk: resident MiB of the block per worker"),
    "epochOrder": ("epoch_order", _STR, "global (one permutation of each block) or chunks (permuted chunks, "
                   "rows shuffled within windows of them: sequential reads for blocks on disk) or auto (chunks for "
                   "blocks on disk or streamed that are larger than memoryBudgetMb)"),
    "chunkMb": ("chunk_mb", _FLOAT, "with epochOrder=chunks: MiB of rows a chunk"),
    "shuffleWindowMb": ("shuffle_window_mb", _optional(_FLOAT), "with epochOrder=chunks: MiB of rows shuffled "
                        "together; None: half the memory budget less one batch"),
    "sync": ("sync", _STR, "gradients (all-reduce every step) or parameters (average every syncEvery steps)"),
    "syncEvery": ("sync_every", _INT, "K local steps between parameter averages with sync=parameters"),
    "model": ("model", _dict_of(ModelSpec), "the network: {'name': 'mlp', 'hidden': [128, 64], ...}"),
    "loss": ("loss", _optional(_STR), "a custom loss 'package.module:fn' returning the batch's summed loss; "
             "None: cross-entropy or MSE"),
    "labelSmoothing": ("label_smoothing", _FLOAT, "cross-entropy's label smoothing in [0, 1); 0: none"),
    "epochs": ("epochs", _INT, "passes over every block"),
    "batchSize": ("batch_size", _INT, "global batch size per step"),
    "optimizer": ("optimizer", _STR, "sgd, adam or adamw"),
    "lr": ("lr", _FLOAT, "peak learning rate"),
    "momentum": ("momentum", _FLOAT, "SGD momentum"),
    "weightDecay": ("weight_decay", _FLOAT, "L2 penalty (decoupled for adamw)"),
    "schedule": ("schedule", _STR, "learning-rate schedule: constant, cosine or step"),
    "warmupSteps": ("warmup_steps", _INT, "linear warm-up steps"),
    "validationFraction": ("validation_fraction", _FLOAT,
                           "share of rows held out for a per-epoch validation loss (or validationIndicatorCol)"),
    "earlyStoppingPatience": ("early_stopping_patience", _INT,
                              "epochs without a lower validation loss before stopping (best weights kept); 0: off"),
    "seed": ("seed", _INT, "seeds model init, block assignment and shuffles"),
    "checkEvery": ("check_every", _INT, "steps between replica-consistency checks; 0: only at the end"),
    "device": ("device", _STR, "auto (the task's GPU if usable), cpu or cuda"),
    "mixedPrecision": ("mixed_precision", _STR, "none or bf16"),
    "threadsPerWorker": ("threads_per_worker", _optional(_INT), "torch threads per worker; None: spark.task.cpus"),
    "shard": ("shard", _STR, "none (every rank holds the whole optimizer state) or optimizer (ZeRO stage 1: each "
              "rank holds and steps 1/numWorkers of it)"),
    "compression": ("compression", _STR, "gradient compression: none, fp16, topk or int8"),
    "overlap": ("overlap", _optional(TypeConverters.toBoolean), "all-reduce gradient buckets during backward "
                "(horovod, torch_gloo; compression none or fp16); None: wherever it can run"),
    "bucketMb": ("bucket_mb", _FLOAT, "with overlap: MiB of gradients at which a bucket closes"),
    "topkRatio": ("topk_ratio", _FLOAT, "share of entries sent with compression=topk"),
    "powersgdRank": ("powersgd_rank", _INT, "rank of each matrix's approximation with compression=powersgd"),
    "checkpoint": ("checkpoint", _dict_of(CheckpointSettings), "{'dir': URI, 'every_steps': N, 'keep': K}"),
    "maxRestarts": ("max_restarts", _INT, "relaunches after a worker failure, from the latest checkpoint"),
    "timeouts": ("timeouts", _dict_of(TimeoutSettings), "{'step_seconds': S, 'barrier_seconds': B}"),
    "horovod": ("horovod", _dict_of(HorovodSettings), "Horovod knobs: {'fusion_threshold_mb': ..., ...}"),
    "glooTimeoutSeconds": ("gloo_timeout_seconds", _INT, "Gloo rendezvous timeout"),
    "networkInterface": ("network_interface", _optional(_STR), "NIC for Gloo; None: the task address's"),
}
"""Not Params: `task` (the estimator's kind), `blocks` (always `auto`: a dataset that is a plain
Parquet scan is read from its files, any other is cut by a shuffle) and `faults` (test-only fault
injection)."""


def _default(field_name: str) -> Any:
    value = getattr(TrainConfig(), field_name)
    return {f.name: getattr(value, f.name) for f in fields(value)} if hasattr(value, "__dataclass_fields__") else value


class TrainParams(HasFeaturesCol, HasLabelCol, HasPredictionCol, HasValidationIndicatorCol, HasWeightCol):
    """The training settings, the columns, and `progress`."""

    featuresCols: Param[list[str]] = Param(
        Params._dummy(), "featuresCols", "numeric columns used as the features instead of featuresCol",
        typeConverter=TypeConverters.toListString,
    )
    progress: Param[str] = Param(Params._dummy(), "progress", "off, log (a line per epoch) or bar (tqdm)",
                                 typeConverter=one_of("progress", ("off", "log", "bar")))
    inputs: Param[list[dict[str, Any]] | None] = Param(
        Params._dummy(), "inputs", "typed inputs instead of featuresCol(s): [{'name': ..., 'kind': 'numeric' | "
        "'tokens' | 'categorical', 'columns': ..., 'cardinality': ..., 'pad': ...}]; the model gets a dict by name",
        typeConverter=_optional(_inputs_list),
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(featuresCol="features", labelCol="label", predictionCol="prediction", progress="off",
                         inputs=None)
        self._setDefault(**{name: _default(key) for name, (key, _, _) in TRAIN_PARAMS.items()})

    def setFeaturesCol(self, value: str) -> TrainParams:
        return self._set(featuresCol=value)

    def setFeaturesCols(self, value: list[str]) -> TrainParams:
        return self._set(featuresCols=value)

    def setLabelCol(self, value: str) -> TrainParams:
        return self._set(labelCol=value)

    def setPredictionCol(self, value: str) -> TrainParams:
        return self._set(predictionCol=value)

    def setInputs(self, value: list[dict[str, Any]]) -> TrainParams:
        return self._set(inputs=value)

    def setWeightCol(self, value: str) -> TrainParams:
        return self._set(weightCol=value)

    def weight_column(self) -> str | None:
        """weightCol when set (and not empty): per-row weights, finite and >= 0, in the training loss."""
        return self.getWeightCol() or None if self.isSet("weightCol") else None

    def validation_column(self) -> str | None:
        """validationIndicatorCol when set: its true rows are held out for the per-epoch validation loss."""
        return self.getValidationIndicatorCol() if self.isSet("validationIndicatorCol") else None

    def features_spec(self) -> str | list[str]:
        """featuresCols when set, else featuresCol: what `train` and `transform` take as `features`."""
        return self.getOrDefault("featuresCols") if self.isSet("featuresCols") else self.getFeaturesCol()

    def train_config(self, task: str, **extra: Any) -> TrainConfig:
        """The TrainConfig these Params describe; a bad value or combination raises ValueError naming it."""
        settings = {key: self.getOrDefault(name) for name, (key, _, _) in TRAIN_PARAMS.items()}
        return TrainConfig(task=task, **settings, **extra)  # type: ignore[arg-type]


def _setter(name: str) -> Any:
    def set_value(self: TrainParams, value: Any) -> TrainParams:
        return self._set(**{name: value})

    set_value.__doc__ = f"Sets `{name}`."
    return set_value


for _name, (_key, _convert, _doc) in TRAIN_PARAMS.items():
    setattr(TrainParams, _name, Param(Params._dummy(), _name, f"{_doc} (TrainConfig.{_key})",
                                      typeConverter=checked(_name, _key, _convert)))
    setattr(TrainParams, f"set{_name[0].upper()}{_name[1:]}", _setter(_name))  # setLr, setNumWorkers, ...
