"""The GPU path without GPUs: a fake discovery script on a standalone cluster gives each task its own address;
with no CUDA the worker falls back to the CPU and says so, or fails saying why when CUDA was demanded."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import torch

from tests.standalone import StandaloneCluster

REPO = Path(__file__).resolve().parent.parent


def skip_with_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: the CPU fallback without CUDA cannot be seen")


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_fake_gpus_one_per_task_and_cpu_fallback(tmp_path):
    skip_with_cuda()
    script = tmp_path / "gpus.sh"
    script.write_text('#!/usr/bin/env bash\necho \'{"name": "gpu", "addresses": ["0", "1", "2", "3"]}\'\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    opts = f"-Dspark.worker.resource.gpu.amount=4 -Dspark.worker.resource.gpu.discoveryScript={script}"
    cluster = StandaloneCluster(tmp_path, num_workers=1, cores=4, memory="3g", worker_opts=opts).start()
    try:
        out = tmp_path / "gpu.json"
        proc = cluster.submit(
            str(REPO / "tests" / "jobs" / "gpu_discovery_job.py"), str(out),
            conf={
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.executor.cores": "4",
                "spark.executor.memory": "2g",
                "spark.executor.resource.gpu.amount": "4",
                "spark.executor.resource.gpu.discoveryScript": str(script),
                "spark.task.resource.gpu.amount": "1",
                "spark.ui.enabled": "false",
            },
            timeout=480,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = json.loads(out.read_text())
    finally:
        cluster.stop()
    assert len(report["executors"]) == 1
    assert sorted(g for gpus in report["gpus"] for g in gpus) == ["0", "1", "2", "3"]  # one distinct GPU per task
    assert report["devices"] == ["cpu"] * 4  # this torch has no CUDA
    assert len(set(report["digests"])) == 1  # trained with overlap on: the replicas stayed identical
    assert all(w and "CUDA is unavailable; training on CPU" in w for w in report["warnings"])
    assert "device='cuda' was requested but CUDA is not available" in report["demanded_cuda"]


def test_device_selection_without_cuda():
    from blocksync.engine.worker.worker import select_device

    skip_with_cuda()
    assert select_device("cpu", ["0"]) == (torch.device("cpu"), None)
    device, warning = select_device("auto", ["1"])
    assert device == torch.device("cpu") and "Spark assigned GPU ['1'] but CUDA is unavailable" in warning
    assert select_device("auto", []) == (torch.device("cpu"), None)
    with pytest.raises(RuntimeError, match=r"device='cuda' was requested but CUDA is not available"):
        select_device("cuda", ["0"])


class FakeCudaTensor:
    """Where CUDA is absent: what `to_collective` looks at in a CUDA tensor (its device) and can do (copy to host)."""

    device = torch.device("cuda", 0)

    def __init__(self, values: list[float]) -> None:
        self.values = values

    def cpu(self) -> torch.Tensor:
        return torch.tensor(self.values)


@pytest.mark.parametrize("backend", ["spark", "torch_gloo"])
def test_host_staging_for_gloo(backend):
    from blocksync.engine.comm.collectives import SparkCollective, TorchGlooCollective, to_collective

    kind = {"spark": SparkCollective, "torch_gloo": TorchGlooCollective}[backend]
    coll = kind.__new__(kind)  # no Spark needed to ask where tensors go
    cpu = torch.ones(3)
    assert to_collective(coll, cpu) is cpu  # host tensors go as they are
    on_gpu = torch.tensor([1.0, 2.0, 3.0], device="cuda") if torch.cuda.is_available() else FakeCudaTensor([1, 2, 3])
    staged = to_collective(coll, on_gpu)
    assert isinstance(staged, torch.Tensor) and staged.device == torch.device("cpu")  # copied to host memory
    assert staged.tolist() == [1.0, 2.0, 3.0]


def test_device_capable_collective_gets_gpu_tensors_as_they_are():
    from blocksync.engine.comm.collectives import HorovodCollective, to_collective

    coll = HorovodCollective.__new__(HorovodCollective)
    coll.device_tensors = True  # what a Horovod built with NCCL reports
    on_gpu = torch.ones(3, device="cuda") if torch.cuda.is_available() else FakeCudaTensor([1, 1, 1])
    assert to_collective(coll, on_gpu) is on_gpu


def test_bf16_mixed_precision_trains_and_keeps_replicas_identical(spark):
    from blocksync import ModelSpec, TrainConfig, train
    from tests.conftest import synthetic_classification

    df = spark.createDataFrame(synthetic_classification(800, 16, 4, seed=8))
    result = train(spark, df, TrainConfig(num_workers=4, backend="torch_gloo", epochs=4, batch_size=64, lr=0.01,
                                          mixed_precision="bf16", model=ModelSpec(name="mlp", hidden=[32])))
    assert len({s["digest"] for s in result.rank_summaries}) == 1
    assert result.history[-1]["train_accuracy"] >= 0.9
