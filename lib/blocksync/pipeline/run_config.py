"""The run configuration users write in YAML, loaded strictly.

Precedence: dataclass defaults < the YAML file < `key.sub=value` overrides.
Unknown keys are errors that name the key and the closest valid one; type
errors and out-of-range values are collected, and all are reported together in
one `ConfigError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from blocksync.engine.config import ModelSpec, TrainConfig


class ConfigError(ValueError):
    """One or more problems in the config file or overrides; the message lists them all."""

    def __init__(self, problems: list[str], source: str = "config") -> None:
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


@dataclass(kw_only=True)
class SparkSettings:
    master: str | None = "local[4]"
    """Spark master; null leaves it to spark-submit (whose command-line settings always win)."""
    app_name: str = "blocksync"
    """Application name shown in the Spark UI."""
    conf: dict[str, Any] = field(default_factory=dict)
    """Extra Spark settings applied when the CLI builds the session."""


@dataclass(kw_only=True)
class SyntheticSettings:
    rows: int = 100_000
    """Rows generated (on the executors)."""
    features: int = 32
    """Feature count."""
    classes: int = 4
    """Classes, for task=classification."""
    noise: float = 0.5
    """Standard deviation of the noise added to the labels' linear signal."""
    partitions: int = 8
    """Partitions of the generated data."""

    def __post_init__(self) -> None:
        for name in ("rows", "features", "partitions"):
            if getattr(self, name) <= 0:
                raise ValueError(f"data.synthetic.{name}={getattr(self, name)} must be > 0.")
        if self.classes < 2:
            raise ValueError(f"data.synthetic.classes={self.classes} must be >= 2.")
        if self.noise < 0:
            raise ValueError(f"data.synthetic.noise={self.noise} must be >= 0.")


@dataclass(kw_only=True)
class DataSettings:
    source: str = "digits"
    """`digits` (bundled with scikit-learn), `synthetic`, a Parquet/CSV path, or a table name."""
    format: Literal["auto", "parquet", "csv", "table"] = "auto"
    """How to read `source`; auto: by extension (.csv, else Parquet) when it is a path, else a table."""
    features: list[str] | str | None = None
    """Feature columns (a list, or one array/vector column); null: every column except the label."""
    inputs: list[dict[str, Any]] | None = None
    """Typed inputs instead of `features`: a list of {name, kind (numeric, tokens or categorical), columns
    (a list or a glob; default: the column called name), cardinality, pad}; the model receives a dict
    of tensors by name (README "Inputs, models and losses"). Cardinalities left unset are measured in
    prepare over all rows; not standardized (set standardize: false)."""
    label: str = "label"
    """Label column: class names or indices (classification), or a number (regression)."""
    weight: str | None = None
    """Optional column of per-row weights (finite numbers >= 0) for the training loss; never a feature."""
    test_fraction: float = 0.2
    """Share of rows held out for evaluation."""
    seed: int = 42
    """Seed of the train/test split and of synthetic data."""
    standardize: bool = True
    """Scale features to zero mean, unit variance with train-split statistics."""
    invalid_rows: Literal["fail", "drop"] = "fail"
    """Rows with null, NaN or infinite features: fail naming their count, or drop them (count reported)."""
    synthetic: SyntheticSettings = field(default_factory=SyntheticSettings)
    """Settings of the `synthetic` source."""

    def __post_init__(self) -> None:
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"data.test_fraction={self.test_fraction} must be in (0, 1).")
        if not self.source:
            raise ValueError("data.source is empty; use digits, synthetic, a path or a table name.")
        if self.inputs is not None:
            self._check_inputs()

    def _check_inputs(self) -> None:
        from blocksync.engine.inputs import parse_inputs

        try:
            parse_inputs(self.inputs or [])
        except (TypeError, ValueError) as err:
            raise ValueError(f"data.inputs: {err}") from err
        clash = [name for name, on in (("data.features", self.features is not None),
                                       ("data.standardize=true", self.standardize),
                                       ("data.invalid_rows=drop", self.invalid_rows == "drop")) if on]
        if clash:
            raise ValueError(f"data.inputs with {' and '.join(clash)}: those apply to one feature matrix; with typed "
                             "inputs unset data.features, set data.standardize=false and data.invalid_rows=fail "
                             "(a null in an input is an error).")


@dataclass(kw_only=True)
class TrackingSettings:
    mlflow: bool = False
    """Log parameters, per-epoch metrics, the model and the report to MLflow."""
    uri: str = "./mlruns"
    """MLflow tracking URI."""
    experiment: str = "blocksync"
    """MLflow experiment name."""


@dataclass(kw_only=True)
class RunConfig:
    output_dir: str = "runs/local"
    """Run directory (driver-local path): prepared data, model, metrics, report."""
    progress: bool = True
    """Live progress bar on the driver while the barrier stage runs; false for logs and CI."""
    spark: SparkSettings = field(default_factory=SparkSettings)
    """How the CLI builds the SparkSession."""
    data: DataSettings = field(default_factory=DataSettings)
    """Where the data comes from and how it is prepared."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The training engine's settings (blocksync.engine.config.TrainConfig)."""
    tracking: TrackingSettings = field(default_factory=TrackingSettings)
    """Optional experiment tracking."""

    def __post_init__(self) -> None:
        if not str(self.output_dir).strip():
            raise ValueError("output_dir is empty; name the run directory, e.g. output_dir=runs/local.")


# --- strict loading -----------------------------------------------------------

def _type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin is Literal:
        return value in typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return isinstance(value, list) and all(_type_ok(v, item) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    return True


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(h) for h in typing.get_args(hint))
    if hint is type(None):
        return "null"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        hint, getattr(hint, "__name__", str(hint)).replace("list", "a list")
    )


def build(cls: type, data: Any, prefix: str, problems: list[str]) -> Any:
    """An instance of dataclass `cls` from `data`, appending every problem found to `problems`."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        problems.append(f"{prefix or 'config'}: expected a mapping, got {data!r}")
        return None
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; valid keys: {', '.join(names)}"
            problems.append(f"unknown key '{path}'{hint}")
            continue
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = build(typing.cast(type, hint), value, f"{path}.", problems)
        elif isinstance(hint, type) and hint is float and isinstance(value, int) and not isinstance(value, bool):
            kwargs[key] = float(value)
        elif _type_ok(value, hint):
            kwargs[key] = value
        else:
            problems.append(f"'{path}' must be {_describe(hint)}, got {value!r}")
    if any(v is None and dataclasses.is_dataclass(hints[k]) for k, v in kwargs.items()):
        return None
    try:
        return cls(**kwargs)
    except ValueError as err:
        problems.append(str(err))
        return None


class _Loader(yaml.SafeLoader):
    """YAML 1.1 as PyYAML reads it, except that `1e-3` and `1e6` are floats (YAML 1.2), not strings."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def read_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)


def parse_override(text: str) -> tuple[list[str], Any]:
    """`train.lr=0.01` -> (['train', 'lr'], 0.01); the value is read as YAML.

    Keys under `spark.conf.` are Spark's own dotted names and stay whole:
    `spark.conf.spark.task.cpus=2` -> (['spark', 'conf', 'spark.task.cpus'], 2).
    """
    key, sep, raw = text.partition("=")
    if not sep or not key or key.startswith("-"):
        raise ConfigError([f"override {text!r} is not key.sub=value (flags go before the overrides)"], "arguments")
    try:
        value = read_yaml(raw) if raw != "" else ""
    except yaml.YAMLError as err:
        raise ConfigError([f"override {text!r}: value is not valid YAML ({err})"], "arguments") from err
    keys = key.split(".")
    if keys[:2] == ["spark", "conf"] and len(keys) > 2:
        keys = ["spark", "conf", ".".join(keys[2:])]
    return keys, value


def _set_path(tree: dict[str, Any], keys: list[str], value: Any) -> None:
    node = tree
    for k in keys[:-1]:
        child = node.get(k)
        if not isinstance(child, dict):
            child = {}
            node[k] = child
        node = child
    node[keys[-1]] = value


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Defaults < YAML at `path` < overrides. Raises ConfigError listing every problem."""
    tree: dict[str, Any] = {}
    source = "config"
    if path is not None:
        source = str(path)
        p = Path(path)
        if p.is_dir():
            raise ConfigError(["is a folder, not a YAML file; pass a file such as conf/local.yaml"], source)
        if not p.is_file():
            raise ConfigError(["config file not found; pass an existing YAML file such as conf/local.yaml"], source)
        try:
            loaded = read_yaml(p.read_bytes().decode("utf-8"))
        except OSError as err:
            raise ConfigError([f"cannot be read ({err.strerror or err}); check its permissions, or pass a "
                               "readable copy"], source) from err
        except UnicodeDecodeError as err:
            raise ConfigError([f"is not UTF-8 text (byte {err.start}: {err.object[err.start:err.start + 1]!r}); "
                               "save it as UTF-8 YAML"], source) from err
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError([f"malformed YAML{where}: {getattr(err, 'problem', err)}"], source) from err
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError([f"the file must hold a mapping of settings, not {type(loaded).__name__}"], source)
        tree = loaded or {}
    for text in overrides or []:
        keys, value = parse_override(text)
        _set_path(tree, keys, value)
    problems: list[str] = []
    config = build(RunConfig, tree, "", problems)
    if problems:
        raise ConfigError(problems, source)
    return config


def config_to_dict(config: RunConfig) -> dict[str, Any]:
    return dataclasses.asdict(config)


__all__ = ["ConfigError", "DataSettings", "ModelSpec", "RunConfig", "load_config"]
