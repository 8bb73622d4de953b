"""Fault tolerance: checkpoints, relaunch after a lost worker, determinism, stall detection, bad checkpoints."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest

from blocksync import ModelSpec, TrainConfig, TrainingError, train, train_files
from blocksync.engine.checkpoint import CheckpointError, step_dirs
from blocksync.pipeline.report import steps_frame
from tests.conftest import synthetic_classification
from tests.reference import max_param_diff

pytestmark = pytest.mark.timeout(400)

SLACK_SECONDS = 8.0


@pytest.fixture(scope="module")
def data(spark):
    return spark.createDataFrame(synthetic_classification(400, 8, 3, seed=9)).repartition(2)


def config(backend: str, **extra) -> TrainConfig:
    # 400 rows / 40 = 10 steps per epoch, 3 epochs = 30 steps.
    settings = dict(num_workers=4, backend=backend, epochs=3, batch_size=40, optimizer="adam", lr=0.01, seed=4,
                    check_every=5, model=ModelSpec(name="mlp", hidden=[16]))
    return TrainConfig(**{**settings, **extra})


@pytest.fixture(scope="module")
def data_files(data, tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("faults") / "data.parquet")
    data.write.parquet(path)
    return path


@pytest.mark.parametrize("backend,mode,blocks,compression", [
    ("horovod", "exit", "shuffle", "none"), ("torch_gloo", "raise", "shuffle", "none"),
    ("horovod", "exit", "files", "none"),
    ("torch_gloo", "raise", "shuffle", "powersgd"),  # residuals and the warm-start Q come back from the checkpoint
])
def test_lost_worker_is_relaunched_from_the_checkpoint_and_ends_identical(spark, data, data_files, tmp_path, backend,
                                                                          mode, blocks, compression):
    def fit(cfg: TrainConfig):  # blocks=files: the relaunched workers read their rows of the files again
        return train_files(spark, data_files, cfg) if blocks == "files" else train(spark, data, cfg)

    clean = fit(config(backend, compression=compression))
    ckpt = tmp_path / "ckpt"
    faulty = fit(config(
        backend, compression=compression, max_restarts=1, checkpoint={"dir": str(ckpt), "every_steps": 5, "keep": 2},
        faults={"kill_rank": 1, "at_step": 12, "mode": mode},
    ))
    assert [s["resumed_at"] for s in faulty.rank_summaries] == [10] * 4  # resumed from the step-10 checkpoint
    assert max_param_diff(clean.model, faulty.model) == 0.0  # bitwise equal on CPU
    assert faulty.history == clean.history
    assert [step for step, _ in step_dirs(str(ckpt))] == [20, 25]  # the newest `keep`
    # Metrics across the relaunch: traffic counted once per step (the checkpoint carries it), the
    # final attempt's steps numbered from the checkpoint on.
    assert faulty.metrics["resumed_at_step"] == 10 and clean.metrics["resumed_at_step"] == 0
    for key in ("bytes_sent", "payload_bytes_per_step"):
        assert faulty.metrics[key] == clean.metrics[key] > 0, key
    steps = steps_frame(faulty.rank_summaries)
    assert sorted(steps["step"].unique()) == list(range(11, 31)) and len(steps) == 4 * 20


def test_a_fault_in_every_attempt_fails_after_max_restarts(spark, data, tmp_path):
    cfg = config("torch_gloo", max_restarts=1, checkpoint={"dir": str(tmp_path / "c"), "every_steps": 5},
                 faults={"kill_rank": 2, "at_step": 12, "mode": "raise", "repeat": 2})
    expected = r"rank 2\] RuntimeError: injected fault at step 12.*\(after 1 restart\(s\)\)"
    with pytest.raises(TrainingError, match=expected):
        train(spark, data, cfg)


def test_a_hung_worker_is_named_within_the_timeout(spark, data, caplog):
    cfg = config("torch_gloo", timeouts={"step_seconds": 4}, faults={"kill_rank": 3, "at_step": 6, "mode": "hang"})
    expected = (r"stalled: rank 3 at step 6 \(compute\); no rank made progress for ([0-9.]+) s "
                r"\(timeouts.step_seconds=4\)")
    stall_log = caplog.at_level(logging.ERROR, logger="blocksync.engine.progress")
    with stall_log, pytest.raises(TrainingError, match=expected) as err:
        train(spark, data, cfg)
    failed_at = time.time()
    idle = float(re.search(expected, str(err.value)).group(1))
    # Detected after the timeout (the watchdog fires on idle > 4 s; the message rounds to 0.1 s, so 4.04 reads
    # "4.0") and within it plus the watchdog tick and heartbeat latency.
    assert 4.0 <= idle <= 4 + 1.0
    detected_at = next(r.created for r in caplog.records if "cancelling the stage" in r.getMessage())
    assert failed_at - detected_at < SLACK_SECONDS  # then the stage is cancelled and the error raised promptly


def test_a_dead_worker_without_restarts_is_named(spark, data):
    cfg = config("torch_gloo", faults={"kill_rank": 0, "at_step": 3, "mode": "exit"})
    expected = r"rank 0's Python worker ended without finishing; its last heartbeat was at step 3 \(compute\)"
    with pytest.raises(TrainingError, match=expected):
        train(spark, data, cfg)


def make_checkpoint(spark, data, directory: Path, **model) -> None:
    train(spark, data, config("torch_gloo", epochs=1, checkpoint={"dir": str(directory), "every_steps": 5},
                              model=ModelSpec(name="mlp", **model)))


def test_corrupted_checkpoint_is_refused_before_launch(spark, data, tmp_path):
    make_checkpoint(spark, data, tmp_path, hidden=[16])
    (_, latest), = step_dirs(str(tmp_path))
    (Path(latest) / "state.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match=r"step-000000005 is corrupted or incomplete"):
        train(spark, data, config("torch_gloo", checkpoint={"dir": str(tmp_path)}))


def test_checkpoint_of_another_model_shape_is_refused(spark, data, tmp_path):
    make_checkpoint(spark, data, tmp_path, hidden=[8])
    with pytest.raises(CheckpointError, match=r"holds a model of a different shape"):
        train(spark, data, config("torch_gloo", checkpoint={"dir": str(tmp_path)}))


def test_killing_an_executor_is_refused_in_local_mode(spark, data):
    cfg = config("torch_gloo", faults={"kill_rank": 1, "at_step": 3, "mode": "executor"})
    with pytest.raises(ValueError, match=r"faults.mode=executor kills the rank's executor JVM, which in local mode"):
        train(spark, data, cfg)


def test_fault_settings_are_validated():
    with pytest.raises(ValueError, match=r"faults.kill_rank=4 but num_workers=4"):
        TrainConfig(num_workers=4, faults={"kill_rank": 4})
    with pytest.raises(ValueError, match=r"faults.mode='explode' is not one of exit, raise, hang, executor"):
        TrainConfig(faults={"mode": "explode"})
