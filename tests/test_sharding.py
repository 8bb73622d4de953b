"""shard=optimizer (ZeRO stage 1): equal to the replicated run, 1/N of the optimizer state per rank,
checkpoints per shard (bitwise relaunch, resharding onto another num_workers), and the refusals."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from blocksync import ModelSpec, TrainConfig, TrainingError, make_blocks, train, train_blocks
from blocksync.engine.checkpoint import CheckpointError, step_dirs
from blocksync.engine.comm.collectives import Collective
from blocksync.engine.comm.sharding import Layout, reshard, shards_needed
from blocksync.engine.driver.input_columns import resolve_inputs
from blocksync.engine.worker.state_fits import TrainingStateTooLarge, check_state_fits
from tests.conftest import synthetic_classification
from tests.helpers import collect_blocks
from tests.reference import max_param_diff, reference_train
from tests.test_engine import unequal_blocks
from tests.test_inputs import SHOP_INPUTS, weighted_shop
from tests.test_validation import noisy_table
from tests.test_weights import weighted_frame

pytestmark = pytest.mark.timeout(400)

MLP = ModelSpec(name="mlp", hidden=[16])


def blocks_for(spark, data: str, workers: int):
    """(blocks, info, train extra kwargs) of one test case's data."""
    if data == "unequal":  # the smallest block has empty local batches in some steps
        return (*unequal_blocks(spark, [90, 50, 31, 9]), {})
    if data == "weights":
        df = spark.createDataFrame(weighted_frame(130, seed=4))
        return (*make_blocks(df, features="features", label="label", num_workers=workers, seed=5, weight="w"), {})
    if data == "typed":
        df = spark.createDataFrame(weighted_shop(100, seed=5))
        spec = resolve_inputs(df, SHOP_INPUTS)
        return (*make_blocks(df, label="label", num_workers=workers, seed=1, inputs=spec, weight="w"), {})
    raise AssertionError(data)


CASES = {
    # name: (backend, data, settings)
    # overlap=true: sharded, the buckets are all-reduced during backward and each rank steps its slice of them.
    "adam-unequal-blocks-overlap": ("torch_gloo", "unequal", dict(optimizer="adam", lr=0.01, batch_size=16, epochs=3,
                                                                  overlap=True, bucket_mb=0.0005)),
    "adamw-row-weights": ("horovod", "weights", dict(optimizer="adamw", lr=0.02, weight_decay=0.05, batch_size=24,
                                                      epochs=3)),
    "sgd-momentum-typed-inputs": ("torch_gloo", "typed", dict(optimizer="sgd", lr=0.05, momentum=0.9, batch_size=24,
                                                              epochs=2, model=ModelSpec(name="embedding_mlp",
                                                                                        hidden=[8]))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sharded_optimizer_equals_the_replicated_run(spark, case):
    backend, data, settings = CASES[case]
    workers = 4 if data == "unequal" else 3
    blocks, info, _ = blocks_for(spark, data, workers)
    cfg = TrainConfig(**{"num_workers": workers, "backend": backend, "seed": 3, "check_every": 4, "model": MLP,
                         "blocks": "shuffle", **settings})
    replicated = train_blocks(spark, blocks, info, cfg)
    sharded = train_blocks(spark, blocks, info, TrainConfig(**{**cfg.to_dict(), "shard": "optimizer"}))
    diff = max_param_diff(sharded.model, replicated.model)
    print(f"{case}: max |sharded - replicated| = {diff:.3g}")
    assert diff <= 1e-6
    assert len({s["digest"] for s in sharded.rank_summaries}) == 1  # the replica check ran on gathered parameters
    assert [e["epoch"] for e in sharded.history] == [e["epoch"] for e in replicated.history]
    assert sharded.metrics["shard"] == "optimizer" and replicated.metrics["shard"] == "none"
    # Optimizer state per rank: the whole of it replicated, one padded slice of it sharded.
    params = list(replicated.model.parameters())
    num_params = sum(p.numel() for p in params)
    adam = cfg.optimizer in ("adam", "adamw")
    per_param = 8 if adam else 4  # two float32 moments, or the momentum buffer
    step_bytes = 4 if adam else 0  # Adam's step count, a float32 scalar per optimized tensor
    chunk = math.ceil(num_params / workers)
    whole = num_params * per_param + step_bytes * len(params)
    assert replicated.metrics["optimizer_bytes_per_rank"] == [whole] * workers
    assert sharded.metrics["optimizer_bytes_per_rank"] == [chunk * per_param + step_bytes] * workers
    if data == "unequal":  # and the independent single-process reference agrees
        reference = reference_train(collect_blocks(blocks, workers), cfg, num_outputs=3)
        assert max_param_diff(sharded.model, reference) <= 1e-5
        # torch_gloo has no reduce-scatter of its own: the fallback all-reduces (2(N-1)/N S) and keeps a slice,
        # then the gather sends (N-1)/N S more. With overlap the buckets hold the parameters, unpadded.
        scattered = num_params * 4 if cfg.overlaps else chunk * workers * 4
        assert sharded.metrics["overlap"] == cfg.overlaps
        assert sharded.metrics["bytes_sent"] / sharded.metrics["steps"] / workers == pytest.approx(
            2 * 3 / 4 * scattered + 3 * chunk * 4)


def test_sharded_early_stopping_on_horovod_keeps_the_same_best_epoch(spark):
    df, _, _ = noisy_table(spark)
    cfg = TrainConfig(num_workers=3, backend="horovod", epochs=12, batch_size=32, lr=0.02, seed=1,
                      model={"name": "mlp", "hidden": [64]}, early_stopping_patience=2, optimizer="adam")
    replicated = train(spark, df, cfg, validation="held")
    sharded = train(spark, df, TrainConfig(**{**cfg.to_dict(), "shard": "optimizer"}), validation="held")
    assert len(sharded.history) == len(replicated.history)
    assert [e["val_loss"] for e in sharded.history] == pytest.approx([e["val_loss"] for e in replicated.history],
                                                                     rel=1e-6)
    diff = max_param_diff(sharded.model, replicated.model)
    print(f"early stopping on horovod: {len(sharded.history)} epochs, max |sharded - replicated| = {diff:.3g}")
    assert diff <= 1e-6
    # Horovod's own reduce-scatter: (N-1)/N S for the gradient, (N-1)/N S for the all-gather.
    num_params = sum(p.numel() for p in replicated.model.parameters())
    chunk = math.ceil(num_params / 3)
    wire_per_step = sharded.metrics["bytes_sent"] / sharded.metrics["steps"] / 3
    assert wire_per_step == pytest.approx(2 / 3 * chunk * 3 * 4 + 2 * chunk * 4)


def fault_config(**extra) -> TrainConfig:
    # 400 rows / 40 = 10 steps per epoch, 3 epochs = 30 steps.
    settings = dict(num_workers=4, backend="torch_gloo", epochs=3, batch_size=40, optimizer="adam", lr=0.01, seed=4,
                    check_every=5, model=MLP, shard="optimizer")
    return TrainConfig(**{**settings, **extra})


@pytest.fixture(scope="module")
def data(spark):
    return spark.createDataFrame(synthetic_classification(400, 8, 3, seed=9)).repartition(2)


def test_a_sharded_relaunch_is_bitwise_and_another_num_workers_reshards(spark, data, tmp_path):
    clean = train(spark, data, fault_config())
    ckpt = tmp_path / "ckpt"
    faulty = train(spark, data, fault_config(max_restarts=1, checkpoint={"dir": str(ckpt), "every_steps": 5},
                                             faults={"kill_rank": 1, "at_step": 12, "mode": "raise"}))
    assert [s["resumed_at"] for s in faulty.rank_summaries] == [10] * 4
    assert max_param_diff(clean.model, faulty.model) == 0.0  # each rank reloaded its own shard: bitwise
    assert faulty.history == clean.history
    latest = Path(step_dirs(str(ckpt))[-1][1])
    assert sorted(p.name for p in latest.iterdir()) == [
        "manifest.json", *[f"rank-{r:05d}.safetensors" for r in range(4)], "state.safetensors",
        *[f"zero-{k:05d}.safetensors" for k in range(4)]]

    # A run that dies at step 12 leaves the step-10 checkpoint of 4 shards; 2 workers resume from it.
    stopped = tmp_path / "stopped"
    with pytest.raises(TrainingError, match="injected fault at step 12"):
        train(spark, data, fault_config(checkpoint={"dir": str(stopped), "every_steps": 10},
                                        faults={"kill_rank": 0, "at_step": 12, "mode": "raise"}))
    resumed = train(spark, data, fault_config(num_workers=2, checkpoint={"dir": str(stopped), "every_steps": 10}))
    assert [s["resumed_at"] for s in resumed.rank_summaries] == [10, 10]
    assert resumed.metrics["steps"] == 30 and len(resumed.history) == 3
    assert len({s["digest"] for s in resumed.rank_summaries}) == 1
    # Not bitwise (other blocks from step 10 on), but it goes on from the checkpoint: epoch 1 is the old run's.
    assert resumed.history[0] == clean.history[0]
    assert resumed.history[-1]["train_loss"] < resumed.history[0]["train_loss"]
    chunk = math.ceil(sum(p.numel() for p in clean.model.parameters()) / 2)
    assert resumed.metrics["optimizer_bytes_per_rank"] == [chunk * 8 + 4] * 2  # two Adam slices now

    with pytest.raises(CheckpointError, match=r"written with shard='optimizer' and this run has shard='none'"):
        train(spark, data, fault_config(shard="none", checkpoint={"dir": str(stopped)}))


def test_reshard_cuts_the_same_entries_out_of_other_slices():
    full = {"zero/exp_avg": torch.arange(10, dtype=torch.float32), "zero/exp_avg_sq": -torch.arange(10.0)}
    old = Layout(num_params=10, num_shards=4)  # chunk 3: [0,3) [3,6) [6,9) [9,10)+2 padding
    saved = {}
    for k in range(4):
        lo, hi = old.bounds(k)
        saved[k] = {key: torch.cat([v[lo:hi], torch.zeros(old.chunk - (hi - lo))]) for key, v in full.items()}
        saved[k]["zero/step"] = torch.tensor(7.0)
        saved[k]["zero/index"] = torch.tensor([k, 4, 10])
    for shards in (1, 2, 3, 4, 7):
        new = Layout(num_params=10, num_shards=shards)
        for index in range(shards):
            needed = shards_needed(old, new, index)
            got = reshard({k: saved[k] for k in needed}, old, new, index)
            lo, hi = new.bounds(index)
            for key, v in full.items():
                expected = torch.cat([v[lo:hi], torch.zeros(new.chunk - (hi - lo))])
                assert torch.equal(got[key], expected), (shards, index, key)
            assert got["zero/step"] == 7.0 and "zero/index" not in got


@pytest.mark.parametrize("settings,message", [
    ({"backend": "spark"}, r"shard='optimizer' with backend='spark': the spark backend has no reduce-scatter"),
    ({"sync": "parameters", "sync_every": 2}, r"shard='optimizer' with sync='parameters': local SGD steps every "
                                              r"replica .*use sync=gradients, or shard=none"),
    ({"compression": "topk"}, r"shard='optimizer' with compression='topk': that compression all-gathers every "
                              r"rank's sparse contribution whole.*use compression=none, or shard=none"),
    ({"compression": "int8"}, r"shard='optimizer' with compression='int8'"),
    ({"compression": "powersgd"}, r"shard='optimizer' with compression='powersgd'.*low-rank factors"),
    ({"compression": "fp16"}, r"shard='optimizer' with compression='fp16'.*float16 reduce-scatter"),
])
def test_combinations_that_cannot_shard_are_refused_naming_both_settings(settings, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(shard="optimizer", **settings)


def test_unknown_and_unimplemented_shard_modes_are_refused():
    with pytest.raises(ValueError, match=r"shard='gradients' \(ZeRO stage 2\) is not implemented.*use shard=optimizer"):
        TrainConfig(shard="gradients")
    with pytest.raises(ValueError, match=r"shard='params' is not one of none, optimizer"):
        TrainConfig(shard="params")


def test_the_spark_ml_param_reaches_the_config_and_its_combinations_are_checked():
    from blocksync.ml import BlockSyncClassifier

    clf = BlockSyncClassifier(shard="optimizer", backend="torch_gloo")
    assert clf.getOrDefault("shard") == "optimizer" and BlockSyncClassifier().getOrDefault("shard") == "none"
    assert clf.train_config("classification").shard == "optimizer"
    with pytest.raises(ValueError, match=r"shard='optimizer' with backend='spark'"):
        BlockSyncClassifier(shard="optimizer", backend="spark").train_config("classification")


class SharedCgroupRanks(Collective):
    """Rank 0 of `size` ranks that all share one host and cgroup, in one process: every all-gather returns
    this rank's tensor `size` times, and only this rank contributes to a sum."""

    def allreduce_sum(self, flat, fp16=False):
        return flat

    def allgather(self, tensor):
        return tensor.repeat(self.size)

    def broadcast(self, flat, root=0):
        return flat


def test_a_training_state_over_the_cgroup_limit_is_refused_naming_shard_and_sharded_fits():
    coll = SharedCgroupRanks(0, 4)
    num_params = 2**20  # 4 MiB of float32
    # Adam, replicated: gradients 4 + moments 8 + transient 8 (the packed buffer and its division) = 20 MiB a
    # rank; sharded at N = 4 on horovod: gradients 4, the summed 1 MiB slice and a 4 MiB staging buffer, a
    # quarter of the moments 2, transient 5 (Horovod's copy of a staged round, its 1 MiB output) = 16 MiB.
    free = 70 * 2**20
    replicated = TrainConfig(num_workers=4, optimizer="adam", overlap=False)  # the flat exchange's buffers
    with pytest.raises(TrainingStateTooLarge, match=r"^shard='none': each rank would allocate 20 MiB more for its "
                       r"1,048,576 parameters \(gradients 4, optimizer state 8, transient buffers 8 MiB\), and the "
                       r"ranks sharing a memory cgroup would exceed its limit by 10 MiB; set train.shard=optimizer"):
        check_state_fits(coll, replicated, num_params, memory=(100 * 2**20, 100 * 2**20 - free))
    check_state_fits(coll, TrainConfig(num_workers=4, optimizer="adam", shard="optimizer"), num_params,
                     memory=(100 * 2**20, 100 * 2**20 - free))
    check_state_fits(coll, replicated, num_params, memory=None)  # no limit known: nothing to refuse
    with pytest.raises(TrainingStateTooLarge, match=r"shard='optimizer'.*raise num_workers \(a smaller slice each\)"):
        check_state_fits(coll, TrainConfig(num_workers=4, shard="optimizer"), num_params,
                         memory=(100 * 2**20, 100 * 2**20 - 40 * 2**20))
