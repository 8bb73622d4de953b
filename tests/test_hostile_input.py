"""Hostile input through the CLI: each a one-line message, exit code 2, and nothing written."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(900)


def frame(rows: int = 40, **extra) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    pdf = pd.DataFrame({"a": rng.normal(size=rows), "b": rng.normal(size=rows), "label": rng.integers(0, 3, rows)})
    for k, v in extra.items():
        pdf[k] = v
    return pdf


def cases(tmp: Path) -> list[tuple[str, list[str], str]]:
    def parquet(name: str, pdf: pd.DataFrame) -> str:
        path = tmp / f"{name}.parquet"
        pdf.to_parquet(path)
        return str(path)

    nan = frame()
    nan.loc[[3, 7], "a"] = np.nan
    inf = frame()
    inf.loc[5, "b"] = np.inf
    null_label = frame().astype({"label": "float64"})
    null_label.loc[2, "label"] = np.nan
    good = parquet("good", frame())
    ragged = pd.DataFrame({"features": [[1.0, 2.0], [1.0, 2.0, 3.0]] * 20, "label": [0, 1] * 20})
    empty_dir = tmp / "empty-folder"
    empty_dir.mkdir()
    a_file = tmp / "a-file"
    a_file.write_text("not a folder")
    negative_weight = frame(w=np.ones(40))
    negative_weight.loc[[4, 9], "w"] = -0.5
    base = ["--config", "conf/local.yaml", "--quiet", "train.backend=torch_gloo", "train.epochs=1"]
    tokens = parquet("tokens", pd.DataFrame({"seq": [[1, 2, 3], [4, 5, 16]] * 20, "city": [0, 3] * 20,
                                             "label": [0, 1] * 20}))
    ragged_tokens = parquet("ragged-tokens", pd.DataFrame({"seq": [[1, 2], [3, 4, 5]] * 20, "label": [0, 1] * 20}))
    typed = ["data.standardize=false", "train.model.name=transformer"]
    table = [
        ("token id outside the vocabulary", [f"data.source={tokens}", *typed,
                                             "data.inputs=[{name: seq, kind: tokens, cardinality: 16}]"],
         "data.inputs: inputs['seq']: token id 16 is outside the vocabulary of 16 (cardinality)"),
        ("category beyond its cardinality", [f"data.source={tokens}", *typed, "train.model.name=embedding_mlp",
                                             "data.inputs=[{name: city, kind: categorical, cardinality: 3}]"],
         "inputs['city']: category 3 was not seen by its cardinality=3"),
        ("ragged token arrays", [f"data.source={ragged_tokens}", *typed, "data.inputs=[{name: seq, kind: tokens}]"],
         "inputs['seq']: arrays of ragged length (2 to 3 values)"),
        ("typed inputs with standardization", [f"data.source={tokens}", "train.model.name=transformer",
                                               "data.inputs=[{name: seq, kind: tokens}]"],
         "data.inputs with data.standardize=true: those apply to one feature matrix"),
        ("an input with an unknown key", [f"data.source={tokens}", *typed, "data.inputs=[{name: seq, vocab: 3}]"],
         "data.inputs: inputs[0] has unknown key(s) ['vocab']"),
        ("mlp over typed inputs", [f"data.source={tokens}", *typed, "train.model.name=mlp",
                                   "data.inputs=[{name: seq, kind: tokens}]"],
         "model.name='mlp' reads one float feature matrix, but typed inputs were given"),
        ("typed inputs from files", [f"data.source={tokens}", *typed, "train.blocks=files",
                                     "data.inputs=[{name: seq, kind: tokens}]"],
         "data.inputs with train.blocks=files: typed inputs are cut into blocks by Spark"),
        ("negative row weights", [f"data.source={parquet('negw', negative_weight)}", "data.weight=w"],
         "data.weight='w': 2 rows have a null, NaN, infinite or negative weight"),
        ("missing weight column", [f"data.source={good}", "data.weight=w"],
         "data.weight: weight column 'w' not in the DataFrame"),
        # conf/local.yaml smooths its cross-entropy: a custom loss must say label_smoothing=0 (next case).
        ("a loss that averages instead of summing", [f"data.source={good}", "train.label_smoothing=0",
                                                     "train.loss=tests.custom_losses:mean_cross_entropy"],
         "loss='tests.custom_losses:mean_cross_entropy' returns the mean over the batch's rows"),
        ("a custom loss with the default's label smoothing", [f"data.source={good}",
                                                               "train.loss=tests.custom_losses:smoothed_cross_entropy"],
         "label_smoothing=0.1 applies to the built-in cross-entropy, and loss='tests.custom_losses:"
         "smoothed_cross_entropy' replaces it: smooth inside that loss, or set label_smoothing=0."),
        ("a loss that cannot be imported", [f"data.source={good}", "train.label_smoothing=0",
                                            "train.loss=no_such_pkg.losses:fn"],
         "loss='no_such_pkg.losses:fn': cannot import 'no_such_pkg.losses'"),
        ("missing feature column", [f"data.source={good}", "data.features=[a, c]"],
         "feature column(s) ['c'] not in the DataFrame"),
        ("extra non-numeric column", [f"data.source={parquet('extra', frame(name=['x'] * 40))}"],
         "feature column(s) {'name': 'string'} are not numeric"),
        ("missing label column", [f"data.source={good}", "data.label=target"],
         "label column 'target' not in the data"),
        ("NaN features", [f"data.source={parquet('nan', nan)}"],
         "2 rows have null, NaN or infinite features; clean them, or set data.invalid_rows=drop"),
        ("infinite features", [f"data.source={parquet('inf', inf)}"],
         "1 rows have null, NaN or infinite features"),
        ("null labels", [f"data.source={parquet('nulllabel', null_label)}"],
         "label column 'label' has nulls"),
        ("labels outside the class set", [f"data.source={good}", "train.num_classes=2"],
         "num_classes=2 but labels go up to 2"),
        ("fewer rows than workers", [f"data.source={parquet('tiny', frame(rows=4))}", "data.test_fraction=0.5"],
         "training rows for num_workers=4; every block needs rows"),
        ("empty input", [f"data.source={parquet('empty', frame().iloc[:0])}"],
         "has no rows; check the path, table or filter"),
        ("non-existent path", [f"data.source={tmp / 'nope.parquet'}"], "does not exist; check the path"),
        ("more workers than slots", [f"data.source={good}", "train.num_workers=9"],
         "num_workers=9 but the cluster has 4 task slots"),
        # A Spark key with dots survives the override: 2 cpus per task leave 2 slots of local[4].
        ("spark key in an override", [f"data.source={good}", "spark.conf.spark.task.cpus=2"],
         "num_workers=4 but the cluster has 2 task slots"),
        ("diverging learning rate", [f"data.source={good}", "train.optimizer=sgd", "train.lr=1e30",
                                     "train.epochs=4"], "training diverged at step 1: the all-reduced gradient"),
        ("ragged feature arrays", [f"data.source={parquet('ragged', ragged)}", "data.features=features"],
         "feature arrays have differing lengths (2 to 3 values)"),
        ("empty Parquet folder", [f"data.source={empty_dir}"], "holds no parquet files (an empty folder?)"),
        ("label among the features", [f"data.source={good}", "data.features=[a, label]"],
         "the label column 'label' is also listed among the features"),
        ("custom model too wide", [f"data.source={good}", "train.model.name=tests.custom_models:wide_net"],
         "returns outputs of shape (2, 15) for a batch of 2, but this task needs (2, 3)"),
        ("custom model too narrow", [f"data.source={good}", "train.model.name=tests.custom_models:narrow_net"],
         "returns outputs of shape (2, 2) for a batch of 2, but this task needs (2, 3)"),
        ("model factory that is not one", [f"data.source={good}", "train.model.name=os:system"],
         "model.name='os:system': calling it as factory(2, 3, **model.options) failed (TypeError"),
        ("checkpoint.dir is a file", [f"data.source={good}", f"train.checkpoint.dir={a_file}"],
         "is a file, not a directory; choose another checkpoint.dir"),
        ("unreachable checkpoint store", [f"data.source={good}", "train.checkpoint.dir=hdfs://127.0.0.1:9/ckpt"],
         "train.checkpoint.dir='hdfs://127.0.0.1:9/ckpt' cannot be reached"),
    ]
    # output_dir mistakes, each with its own output_dir
    late = [
        ("output_dir under a file", [f"data.source={good}", f"output_dir={a_file / 'run'}"],
         "is a file, so the directory cannot be made there"),
        ("unwritable output_dir", [f"data.source={good}", "output_dir=/proc/blocksync-run"], "cannot be written"),
        ("output_dir is a file, with --overwrite", [f"data.source={good}", f"output_dir={a_file}", "--overwrite"],
         "is a file, not a directory; choose another output_dir"),
        ("empty output_dir", [f"data.source={good}", "output_dir="], "output_dir is empty"),
        ("output_dir on no filesystem", [f"data.source={good}", "output_dir=nosuchfs://host/run"],
         "output_dir='nosuchfs://host/run': no filesystem for it (UnsupportedFileSystemException"),
        ("blocks=files on a filesystem pyarrow lacks", [f"data.source={good}", "train.blocks=files",
                                                        "output_dir=sftp://root@127.0.0.1:9/run"],
         "train.blocks=files has the workers read the prepared Parquet through pyarrow, which has no filesystem "
         "for output_dir='sftp://root@127.0.0.1:9/run'"),
        ("output_dir on a server that is down", [f"data.source={good}", "output_dir=sftp://root@127.0.0.1:9/run",
                                                 "spark.conf.spark.hadoop.fs.sftp.impl="
                                                 "org.apache.hadoop.fs.sftp.SFTPFileSystem"],
         "output_dir='sftp://root@127.0.0.1:9/run' cannot be reached ("),
    ]
    return [(name, ["run", *base, f"output_dir={tmp / 'out' / str(i)}", *extra], message)
            for i, (name, extra, message) in enumerate(table)] + [(name, ["run", *base, *extra], message)
                                                                 for name, extra, message in late]


def checkpoint_cases(spark, tmp: Path) -> list[tuple[str, list[str], str]]:
    """A good checkpoint of an MLP [16], and a corrupted copy."""
    import shutil

    from blocksync import ModelSpec, TrainConfig, train
    from tests.conftest import synthetic_classification

    good, bad = tmp / "ckpt-good", tmp / "ckpt-bad"
    df = spark.createDataFrame(synthetic_classification(200, 64, 10, seed=0))
    train(spark, df, TrainConfig(num_workers=2, backend="torch_gloo", epochs=1, batch_size=20,
                                 model=ModelSpec(name="mlp", hidden=[16]),
                                 checkpoint={"dir": str(good), "every_steps": 5, "keep": 1}))
    shutil.copytree(good, bad)
    (next(bad.glob("step-*")) / "state.safetensors").write_bytes(b"garbage")
    base = ["--config", "conf/local.yaml", "--quiet", "train.backend=torch_gloo", "train.epochs=1"]
    return [
        ("checkpoint of another model shape",
         ["run", *base, f"output_dir={tmp / 'out' / 'shape'}", f"train.checkpoint.dir={good}",
          "train.model.hidden=[8]"], "holds a model of a different shape"),
        ("corrupted checkpoint",
         ["run", *base, f"output_dir={tmp / 'out' / 'corrupt'}", f"train.checkpoint.dir={bad}",
          "train.model.hidden=[16]"], "is corrupted or incomplete"),
    ]


def _assert_each_case_exits_2_with_its_line(table: list, tmp_path: Path) -> None:
    """Runs every (name, argv, message) case through the CLI in one process (tests/cli_cases.py): each must
    exit 2 with exactly one `blocksync:` line holding its message, and no traceback."""
    (tmp_path / "cases.json").write_text(json.dumps([argv for _, argv, _ in table]))
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run([sys.executable, "-m", "tests.cli_cases", str(tmp_path / "cases.json"),
                           str(tmp_path / "results.json")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=840)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    failures = []
    for (name, _, message), result in zip(table, results, strict=True):
        lines = [ln for ln in result["stderr"].splitlines() if ln.startswith("blocksync:")]
        ok = result["code"] == 2 and len(lines) == 1 and message in lines[0] and "Traceback" not in result["stderr"]
        if not ok:
            failures.append((name, result["code"], lines or result["stderr"][-500:]))
    assert not failures, failures


def test_hostile_inputs_exit_2_with_one_line_and_write_nothing(spark, tmp_path):
    table = cases(tmp_path) + checkpoint_cases(spark, tmp_path)
    _assert_each_case_exits_2_with_its_line(table, tmp_path)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing half-written
    assert (tmp_path / "a-file").read_text() == "not a folder"  # not replaced, even under --overwrite
    assert not Path("/proc/blocksync-run").exists()


def test_invalid_rows_can_be_dropped_and_counted(spark, tmp_path):
    from blocksync.pipeline.run_config import load_config
    from blocksync.pipeline.stages import prepare_stage

    pdf = frame()
    pdf.loc[[1, 2, 3], "a"] = [np.nan, np.inf, -np.inf]
    pdf.to_parquet(tmp_path / "dirty.parquet")
    config = load_config(None, [f"data.source={tmp_path / 'dirty.parquet'}", "data.invalid_rows=drop"])
    meta = prepare_stage(spark, config, tmp_path / "run")
    assert meta["dropped_invalid_rows"] == 3
    assert meta["rows"]["train"] + meta["rows"]["test"] == 37
    # Every row invalid: dropping them all leaves nothing, which is said rather than trained on.
    pdf["a"] = np.nan
    pdf.to_parquet(tmp_path / "all-dirty.parquet")
    config = load_config(None, [f"data.source={tmp_path / 'all-dirty.parquet'}", "data.invalid_rows=drop"])
    with pytest.raises(ValueError, match=r"all 40 rows of data.source=.* have null, NaN or infinite features and "
                                         r"data.invalid_rows=drop dropped them: nothing is left to train on"):
        prepare_stage(spark, config, tmp_path / "run-all-dirty")
    assert not (tmp_path / "run-all-dirty" / "prepared").exists()  # nothing half-written


def test_missing_horovod_is_named_before_launch(spark, monkeypatch):
    from blocksync import TrainConfig, train
    from tests.conftest import synthetic_classification

    monkeypatch.setitem(sys.modules, "horovod.torch", None)  # what a missing or broken build looks like
    df = spark.createDataFrame(synthetic_classification(40, 4, 2, seed=0))
    with pytest.raises(ValueError, match=r"backend 'horovod' needs Horovod 0.28.1 built with PyTorch and Gloo"):
        train(spark, df, TrainConfig(num_workers=2, backend="horovod"))


def test_horovod_missing_through_the_cli(tmp_path):
    fake = tmp_path / "fake" / "horovod"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('simulated: built against another torch')\n")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": str(tmp_path / "fake")}
    proc = subprocess.run([sys.executable, "-m", "blocksync.pipeline.cli", "run", "--config", "conf/local.yaml",
                           "--quiet", f"output_dir={tmp_path / 'out'}"], cwd=REPO, env=env, capture_output=True,
                          text=True,
                          timeout=300)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("blocksync:")]
    assert len(lines) == 1 and "backend 'horovod' needs Horovod 0.28.1" in lines[0]
    assert "simulated: built against another torch" in lines[0]
    assert not (tmp_path / "out").exists()


def python_without_blocksync(tmp: Path) -> Path:
    """An executor Python with PySpark but not blocksync: no site-packages, only pyspark and py4j."""
    pkgs = tmp / "pyspark-only"
    pkgs.mkdir()
    for name in ("pyspark", "py4j"):
        (pkgs / name).symlink_to(Path(importlib.import_module(name).__file__).parent)
    python = tmp / "python-without-blocksync"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{pkgs}:$PYTHONPATH" exec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    return python


def test_executors_without_blocksync_get_one_line_and_the_fix(tmp_path):
    """The real failure: the closure cannot be unpickled on the executors. Stderr is the one line
    (the JVM's banner and Java stack traces go to Spark's log file), exit 2, nothing written."""
    frame().to_parquet(tmp_path / "good.parquet")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [sys.executable, "-m", "blocksync.pipeline.cli", "run", "--config", "conf/local.yaml", "--quiet",
         "train.backend=torch_gloo", f"data.source={tmp_path / 'good.parquet'}", f"output_dir={tmp_path / 'out'}",
         f"spark.conf.spark.pyspark.python={python_without_blocksync(tmp_path)}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("blocksync: error: the executors' Python cannot import 'blocksync'")
    assert "spark.pyspark.python" in lines[0] and "--py-files" in lines[0]
    assert not (tmp_path / "out").exists()


def run_directory(path: Path, features: list[str]) -> Path:
    """A CLI run's model/ (a logistic regression with seeded weights, as `save_model` writes it): predict needs
    no training to be tried."""
    import torch

    from blocksync import ModelSpec
    from blocksync.pipeline.artifacts import model_meta, save_model

    torch.manual_seed(0)
    width = len(features)
    meta = model_meta(ModelSpec(name="logreg"), width, 3, {"task": "classification", "feature_columns": features,
                      "label_column": "label", "labels": [0, 1, 2], "mean": [0.0] * width, "std": [1.0] * width})
    save_model(path / "model", torch.nn.Linear(width, 3), meta)
    return path


def predict_cases(spark, tmp: Path) -> list[tuple[str, list[str], str]]:
    """Mistakes on `blocksync predict` and on the models it loads, each with its own --output under tmp/out."""
    import shutil

    from blocksync.pipeline.predict import run_model
    from blocksync.pipeline.run_files import RunFiles

    run = run_directory(tmp / "run", ["a", "b"])
    rows = frame().drop(columns="label")
    rows.to_parquet(tmp / "new.parquet")
    nulls, nans = rows.copy(), rows.copy()
    nulls.loc[3, "a"] = None
    nulls.astype({"a": "Float64"}).to_parquet(tmp / "nulls.parquet")  # a real null, not NaN
    nans.loc[5, "b"] = np.nan
    nans.to_parquet(tmp / "nans.parquet")
    (tmp / "input-dir").mkdir()
    rows.to_parquet(tmp / "input-dir" / "part-0.parquet")
    (tmp / "a-file").write_text("not a folder")

    def damaged(name: str, edit) -> str:
        copy = tmp / f"model-{name}"
        shutil.copytree(run, copy)
        edit(copy / "model")
        return str(copy)

    def edit_json(**changes):
        def edit(folder: Path) -> None:
            meta = json.loads((folder / "model.json").read_text())
            (folder / "model.json").write_text(json.dumps({**meta, **changes}))
        return edit

    ml_model = str(tmp / "ml-model")
    run_model(RunFiles(spark, str(run), setting="--model"), trust_custom_code=False)[0].save(ml_model)
    ml_truncated = tmp / "ml-truncated"
    shutil.copytree(ml_model, ml_truncated)
    part = next((ml_truncated / "weights").glob("part-*.parquet"))
    part.write_bytes(part.read_bytes()[:200])
    ml_edited = tmp / "ml-edited"
    shutil.copytree(ml_model, ml_edited)
    (next((ml_edited / "metadata").glob("part-*"))).write_text("{not json")
    out = tmp / "out"
    predict = ["predict", "--quiet"]
    table = [
        ("null in a feature column", ["--model", str(run), "--input", str(tmp / "nulls.parquet")],
         "--input: a row has a null, NaN or infinite value in feature column(s) ['a', 'b']; the model scores "
         "numbers only: fill or drop those rows first"),
        ("NaN in a feature column", ["--model", str(run), "--input", str(tmp / "nans.parquet")],
         "--input: a row has a null, NaN or infinite value in feature column(s) ['a', 'b']"),
        ("model.json that is not JSON", ["--model", damaged("notjson", lambda f: (f / "model.json").write_bytes(
            b"\x00\xffgarbage")), "--input", str(tmp / "new.parquet")],
         "model.json is not a blocksync model file or is damaged (not UTF-8 JSON"),
        ("truncated weights", ["--model", damaged("truncated", lambda f: (f / "model.safetensors").write_bytes(
            (f / "model.safetensors").read_bytes()[:60])), "--input", str(tmp / "new.parquet")],
         "model.safetensors is not a blocksync model file or is damaged (not safetensors"),
        ("edited widths", ["--model", damaged("width", edit_json(num_features=4, mean=None, std=None)),
                           "--input", str(tmp / "new.parquet")],
         "model.safetensors is not a blocksync model file or is damaged (its tensors do not fit the network in"),
        ("edited task", ["--model", damaged("task", edit_json(task="ranking")), "--input", str(tmp / "new.parquet")],
         "model.json is not a blocksync model file or is damaged (task='ranking': not one of"),
        ("edited standardization", ["--model", damaged("mean", edit_json(mean=[0.0])),
                                    "--input", str(tmp / "new.parquet")],
         "model.json is not a blocksync model file or is damaged (mean holds 1 values for 2 features)"),
        ("Spark ML model with truncated weights", ["--model", str(ml_truncated), "--input", str(tmp / "new.parquet")],
         "ml-truncated/weights is not a blocksync model file or is damaged"),
        ("Spark ML model with edited metadata", ["--model", str(ml_edited), "--input", str(tmp / "new.parquet")],
         "ml-edited/metadata is not a blocksync model file or is damaged"),
    ]
    cases = [(name, [*predict, *extra, "--output", str(out / str(i))], message)
             for i, (name, extra, message) in enumerate(table)]
    new = ["--model", str(run), "--input", str(tmp / "input-dir")]
    overlapping = [
        ("--output under a file", [*new, "--overwrite", "--output", str(tmp / "a-file" / "out")],
         "a-file is a file, so the directory cannot be made there; choose another --output"),
        ("--output is a file", [*new, "--overwrite", "--output", str(tmp / "a-file")],
         "is a file, not a directory; choose another --output"),
        ("--output is --input", [*new, "--overwrite", "--output", str(tmp / "input-dir")],
         "input-dir' is --input ("),
        ("--output is --input, spelled another way", [*new, "--overwrite", "--output", f"{tmp}/./input-dir/"],
         "is --input ("),
        ("--output inside --input", [*new, "--output", str(tmp / "input-dir" / "scored")],
         "input-dir/scored' lies inside --input ("),
        ("--output contains --input", [*new, "--overwrite", "--output", str(tmp)], "contains --input ("),
        ("--output is --model", ["--model", str(run), "--input", str(tmp / "new.parquet"), "--overwrite",
                                 "--output", str(run)], "run' is --model ("),
        ("--output on an unwritable path", [*new, "--output", "/proc/blocksync-scored"], "cannot be written"),
    ]
    return cases + [(name, [*predict, *extra], message) for name, extra, message in overlapping]


def config_cases(tmp: Path) -> list[tuple[str, list[str], str]]:
    latin1 = tmp / "latin1.yaml"
    latin1.write_bytes("train:\n  lr: 0.01  # \xe9t\xe9\n".encode("latin-1"))
    binary = tmp / "model.safetensors.yaml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    tabs = tmp / "tabs.yaml"
    tabs.write_text("train:\n\tlr: 0.01\n")
    folder = tmp / "conf-folder"
    folder.mkdir()
    return [
        ("config not UTF-8", ["run", "--config", str(latin1)],
         "latin1.yaml: is not UTF-8 text (byte 21: b'\\xe9'); save it as UTF-8 YAML"),
        ("config that is binary", ["run", "--config", str(binary)], "model.safetensors.yaml: is not UTF-8 text"),
        ("config with tabs", ["run", "--config", str(tabs)], "tabs.yaml: malformed YAML at line 2"),
        ("config that is a folder", ["run", "--config", str(folder)], "conf-folder: is a folder, not a YAML file"),
    ]


def weight_cases(tmp: Path) -> list[tuple[str, list[str], str]]:
    zero, tiny = frame(w=np.zeros(40)), frame(w=np.full(40, 1e-45))
    zero.to_parquet(tmp / "zero-weights.parquet")
    tiny.to_parquet(tmp / "tiny-weights.parquet")
    base = ["run", "--config", "conf/local.yaml", "--quiet", "train.backend=torch_gloo", "train.epochs=1",
            "data.weight=w"]
    return [
        ("all-zero weights", [*base, f"data.source={tmp / 'zero-weights.parquet'}", f"output_dir={tmp / 'out' / 'w0'}"],
         "data.weight='w': all rows' weights sum to 0, and a loss weighted by them has no mean"),
        ("weights too small to sum", [*base, f"data.source={tmp / 'tiny-weights.parquet'}",
                                      f"output_dir={tmp / 'out' / 'w1'}"],
         "data.weight='w': all rows' weights sum to 4e-44"),
    ]


def test_hostile_predict_load_and_config_exit_2_with_one_line_and_write_nothing(spark, tmp_path):
    table = predict_cases(spark, tmp_path) + config_cases(tmp_path) + weight_cases(tmp_path)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    _assert_each_case_exits_2_with_its_line(table, tmp_path)
    after = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
                   if p.name not in ("cases.json", "results.json"))  # the harness's own files
    assert after == before  # nothing written, nothing removed: the input read under --overwrite is intact
    assert (tmp_path / "a-file").read_text() == "not a folder"
    assert not Path("/proc/blocksync-scored").exists()


def test_spark_ml_api_refuses_bad_params_when_set_and_bad_rows_and_weights_with_their_cause(spark, tmp_path):
    from pyspark.ml.feature import VectorAssembler

    from blocksync import TrainConfig, train
    from blocksync.engine.errors import TrainingError
    from blocksync.ml import BlockSyncClassificationModel, BlockSyncClassifier, BlockSyncRegressor

    # Params: a bad value raises when it is set (constructor, setter, setParams), naming the Param; nothing
    # waits for fit.
    with pytest.raises(ValueError, match=r"Param numWorkers: num_workers=0 must be > 0"):
        BlockSyncClassifier(numWorkers=0)
    clf = BlockSyncClassifier(numWorkers=2, backend="torch_gloo", epochs=1, featuresCols=["a", "b"])
    with pytest.raises(ValueError, match=r"Param backend: backend='nccl' is not one of horovod, torch_gloo, spark"):
        clf.setBackend("nccl")
    with pytest.raises(ValueError, match=r"Param labelSmoothing: label_smoothing=1.5 must be in \[0, 1\)"):
        clf.setParams(labelSmoothing=1.5)
    with pytest.raises(ValueError, match=r"Param numClasses: num_classes=1 must be >= 2"):
        BlockSyncClassifier(numClasses=1)
    with pytest.raises(ValueError, match=r"progress='loud': choose one of \['off', 'log', 'bar'\]"):
        BlockSyncRegressor(progress="loud")
    with pytest.raises(ValueError, match=r"Param compression: compression='zip' is not one of"):
        BlockSyncRegressor(compression="zip")
    assert clf.getOrDefault("backend") == "torch_gloo"  # a refused value leaves the Param as it was

    # Row weights: all zero, through a shuffle (the driver's pass) and through a plain Parquet scan (each
    # worker reads its own files: the ranks' summed weight is checked after the first epoch).
    zero = frame(w=np.zeros(40))
    zero.to_parquet(tmp_path / "zero.parquet")
    with pytest.raises(ValueError, match=r"weight column 'w': the training rows' weights sum to 0, and a loss "
                                         r"weighted by them has no mean"):
        clf.copy().setWeightCol("w").fit(spark.createDataFrame(zero))
    with pytest.raises(TrainingError, match=r"the row weights: the training rows' weights sum to 0") as caught:
        clf.copy().setWeightCol("w").fit(spark.read.parquet(str(tmp_path / "zero.parquet")))
    assert caught.value.kind == "input"
    with pytest.raises(ValueError, match=r"weight column 'w': the training rows' weights sum to 4e-44"):
        train(spark, spark.createDataFrame(frame(w=np.full(40, 1e-45))),
              TrainConfig(num_workers=2, backend="torch_gloo", epochs=1), features=["a", "b"], weight="w")

    # Scoring rows with a null or NaN feature: the query fails with the cause, naming featuresCol.
    model = clf.fit(spark.createDataFrame(frame()))
    assert isinstance(model, BlockSyncClassificationModel)
    holes = frame()
    holes.loc[4, "b"] = np.nan
    with pytest.raises(Exception, match=r"blocksync rejected a row: featuresCols has a null, NaN or infinite value "
                                        r"in a row; the network scores numbers only"):
        model.transform(spark.createDataFrame(holes)).collect()
    nulls = spark.createDataFrame(frame()).selectExpr("IF(a > 1, NULL, a) AS a", "b")
    with pytest.raises(Exception, match=r"blocksync rejected a row: featuresCols has a null, NaN or infinite"):
        model.transform(nulls).collect()
    vectors = VectorAssembler(inputCols=["a", "b"], outputCol="features", handleInvalid="keep").transform(nulls)
    on_vectors = model.copy()
    on_vectors.clear(on_vectors.featuresCols)
    with pytest.raises(Exception, match=r"blocksync rejected a row: featuresCol 'features' has a null, NaN or "):
        on_vectors.setFeaturesCol("features").transform(vectors).collect()

    # Saving under a file: the path is named, and nothing is left.
    (tmp_path / "a-file").write_text("not a folder")
    with pytest.raises(ValueError, match=r"a-file/model cannot be written \(ParentNotDirectoryException: .*\); "
                                         r"save to another path"):
        model.save(str(tmp_path / "a-file" / "model"))
    assert (tmp_path / "a-file").read_text() == "not a folder"


def test_a_disk_that_fills_while_scoring_leaves_the_previous_output_and_nothing_else(tmp_path):
    """A real full disk: --output on a 256 KiB tmpfs (mounting needs root; skipped, saying so, without)."""
    disk = tmp_path / "small-disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill: {mounted.stderr.strip() or mounted.returncode}")
    try:
        run = run_directory(tmp_path / "run", ["a", "b"])
        rng = np.random.default_rng(1)
        pd.DataFrame({"a": rng.normal(size=200_000), "b": rng.normal(size=200_000)}).to_parquet(
            tmp_path / "many.parquet")
        (disk / "scored").mkdir()
        (disk / "scored" / "previous.txt").write_text("the last good output")
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
        proc = subprocess.run([sys.executable, "-m", "blocksync.pipeline.cli", "predict", "--quiet", "--overwrite",
                               "--model", str(run), "--input", str(tmp_path / "many.parquet"),
                               "--output", str(disk / "scored")], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300)
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("blocksync:")]
        assert proc.returncode == 1, proc.stderr[-2000:]
        assert len(lines) == 1 and lines[0].startswith(f"blocksync: failed: OSError: writing the scored rows to "
                                                       f"--output {disk / 'scored'} failed (")
        assert "No space left on device" in lines[0] or "ENOSPC" in lines[0], lines[0]
        assert sorted(p.name for p in disk.iterdir()) == ["scored"]  # no staging folder left
        assert [p.name for p in (disk / "scored").iterdir()] == ["previous.txt"]
    finally:
        for _ in range(40):  # the scoring JVM's Python workers may still be exiting: busy for a moment
            if subprocess.run(["umount", str(disk)], capture_output=True).returncode == 0:
                break
            time.sleep(0.5)
        else:
            subprocess.run(["umount", "--lazy", str(disk)], check=True)
