"""Strict config loading and the CLI's handling of bad input: exit 2, one line, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from blocksync.pipeline.cli import main
from blocksync.pipeline.run_config import ConfigError, load_config

REPO = Path(__file__).resolve().parent.parent
CONFS = sorted((REPO / "conf").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFS, ids=lambda p: p.name)
def test_every_conf_file_loads_and_says_how_to_run_it(path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# Run: ") and ("blocksync" in first or "spark-submit" in first or "notebook" in first)
    load_config(path)


def test_precedence_defaults_yaml_overrides():
    config = load_config(REPO / "conf" / "local.yaml", ["train.epochs=3", "train.model.hidden=[8, 4]"])
    assert config.train.epochs == 3                    # override
    assert config.train.model.hidden == [8, 4]         # override of a nested list
    assert config.train.batch_size == 64               # YAML (the default is 128)
    assert config.train.momentum == 0.9                # default
    assert config.data.synthetic.rows == 100_000       # default inside an absent section


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err.strip()
    return code, err


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return str(path)


CASES = [
    ("unknown key", "train:\n  epocs: 3\n", [],
     "unknown key 'train.epocs'; did you mean 'train.epochs'?"),
    ("wrong type", "", ["train.epochs=ten"], "'train.epochs' must be an integer, got 'ten'"),
    ("bad choice", "", ["train.backend=mpi"],
     "'train.backend' must be one of 'horovod', 'torch_gloo', 'spark', 'auto', got 'mpi'"),
    ("bad block source", "", ["train.blocks=hash"],
     "'train.blocks' must be one of 'auto', 'shuffle', 'files', got 'hash'"),
    ("out of range", "", ["train.lr=-1"], "lr=-1.0 must be > 0."),
    ("bad fraction", "", ["data.test_fraction=1.5"], "data.test_fraction=1.5 must be in (0, 1)."),
    ("malformed yaml", "train: [epochs: 3\n", [], "malformed YAML at line 2"),
    ("not a mapping", "- a\n- b\n", [], "the file must hold a mapping of settings, not list"),
    ("bad override", "", ["epochs"], "override 'epochs' is not key.sub=value"),
    ("label smoothing of 1", "", ["train.label_smoothing=1"], "label_smoothing=1.0 must be in [0, 1)"),
    ("label smoothing without classes", "", ["train.task=regression", "train.label_smoothing=0.1"],
     "label_smoothing=0.1 smooths class targets, and task='regression' has none: set label_smoothing=0."),
]


@pytest.mark.parametrize("name,text,overrides,message", CASES, ids=[c[0] for c in CASES])
def test_config_errors_exit_2_with_one_line(capsys, tmp_path, name, text, overrides, message):
    code, err = run_cli(capsys, "run", "--config", write(tmp_path, text), *overrides)
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("blocksync: error: ")
    assert message in err
    assert "Traceback" not in err


def test_all_problems_are_reported_together(tmp_path):
    path = write(tmp_path, "train:\n  epocs: 3\n  batch_size: big\nspark:\n  mastr: local[2]\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [
        "unknown key 'train.epocs'; did you mean 'train.epochs'?",
        "'train.batch_size' must be an integer, got 'big'",
        "unknown key 'spark.mastr'; did you mean 'spark.master'?",
    ]


def test_missing_config_file(capsys, tmp_path):
    code, err = run_cli(capsys, "run", "--config", str(tmp_path / "nope.yaml"))
    assert code == 2 and "config file not found; pass an existing YAML file such as conf/local.yaml" in err


def test_stray_flag_and_unknown_stage(capsys):
    code, err = run_cli(capsys, "run", "--config", "conf/local.yaml", "--bogus")
    assert code == 2 and "unrecognized arguments: --bogus" in err
    code, err = run_cli(capsys, "fly", "--config", "conf/local.yaml")
    assert code == 2 and "invalid choice: 'fly'" in err


def test_exponent_notation_and_dotted_spark_keys(tmp_path):
    from blocksync.pipeline.run_config import load_config

    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 1e-3\n  weight_decay: 5E-4\n")
    config = load_config(path, ["train.momentum=1e-1", "spark.conf.spark.task.cpus=2"])
    assert (config.train.lr, config.train.weight_decay, config.train.momentum) == (0.001, 0.0005, 0.1)
    assert config.spark.conf == {"spark.task.cpus": 2}


@pytest.mark.parametrize("item", ["spark.hadoop.fs.defaultFS", "=hdfs://nn:8020"])
def test_a_predict_conf_without_key_and_value_exits_2_before_spark_starts(capsys, item):
    code, err = run_cli(capsys, "predict", "--model", "runs/none", "--input", "in.parquet", "--output", "out.parquet",
                        "--conf", item)
    assert code == 2
    assert err == (f"blocksync: error: --conf {item!r}: give KEY=VALUE, e.g. --conf "
                   "spark.hadoop.fs.defaultFS=hdfs://nn:8020.")
