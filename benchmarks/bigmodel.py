"""Bigger models on the same cores: blocksync per backend, overlap off and on, against its peers.

Two jobs, 2 workers with one thread each, Adam, one epoch:
- `bigmodel`: an MLP of 2.2 M parameters (128 -> 1024 x 3 -> 2), lr 1e-3, global batch 512, over
  131,072 rows of the synthetic task (benchmarks/data.py: its first file, cut into 4 equal Parquet
  shards once);
- `bigmodel_transformer`: blocksync's `transformer` (d_model 128, 4 heads, 2 layers, feed-forward 512:
  0.4 M parameters) over the 16,384 token sequences of benchmarks/tokens.py, lr 1e-3, global batch 128.

Contenders, alternating in every repetition:
- blocksync on backend horovod and torch_gloo, each with train.overlap off and on (bucket_mb
  BUCKET_MB): `train_files` for the MLP, `train` with the token input for the transformer;
- TorchDistributor (torchrun + DDP over Gloo: bucketed all-reduce overlapped with backward) and
  horovod.spark.run (DistributedOptimizer), both running benchmarks/peer_fns.py on the same shards;
- one process on the driver with 2 threads (the same cores), the rows in memory, the same loop.

Wall time from the call to a trained model on the driver, everything included; blocksync rows also
give the run's samples/s (training loop only) and sync share. The ratios the issue asks for: horovod
over torch_gloo samples/s, blocksync's default over TorchDistributor, and over one process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch

from benchmarks.common import median, write
from benchmarks.data import DATA, FEATURES, accuracy, synthetic
from benchmarks.peer_fns import network
from benchmarks.tokens import blocksync_inputs, load_tokens

HIDDEN = [1024, 1024, 1024]
WORKERS = 2
SHARDS = 4
BUCKET_MB = 1.0
REPETITIONS = 2
ONE_PROCESS = "one process, 2 threads, in memory"
TORCH_DISTRIBUTOR = "TorchDistributor DDP (2 processes)"
DEFAULT = "blocksync horovod, overlap on"  # TrainConfig's defaults: backend horovod, overlap on (null)


@dataclass(frozen=True)
class Job:
    """One network and its data: `net` as benchmarks/peer_fns.py describes it; `files` gives (shards, test file)."""

    name: str
    title: str
    net: dict[str, Any]
    batch: int
    lr: float
    files: Callable[[], tuple[list[str], str]]


def shards() -> tuple[list[str], str]:
    """The first training file of the synthetic data, cut once into SHARDS equal files; and the test file."""
    data = synthetic()
    folder = DATA / "bigmodel"
    files = [str(folder / f"part-{i}.parquet") for i in range(SHARDS)]
    if not all(Path(f).exists() for f in files):
        folder.mkdir(parents=True, exist_ok=True)
        table = pq.read_table(data.train_files[0])
        rows = table.num_rows // SHARDS
        for i, f in enumerate(files):
            pq.write_table(table.slice(i * rows, rows), f + ".tmp")
            Path(f + ".tmp").rename(f)
    return files, data.test_file


MLP = Job("bigmodel", f"MLP 128 -> {' x '.join(map(str, HIDDEN))} -> 2",
          {"kind": "mlp", "hidden": HIDDEN, "features": FEATURES}, batch=512, lr=1e-3, files=shards)


def blocksync_run(spark, job: Job, files: list[str], backend: str, overlap: bool) -> dict[str, Any]:
    """blocksync on the job: `train_files` for the MLP's float features; `train` on spark.read.parquet with
    the token input for the transformer (typed inputs take blocks=shuffle: one Spark shuffle of the rows)."""
    from blocksync import ModelSpec, TrainConfig, train, train_files

    model = (ModelSpec(name="mlp", hidden=job.net["hidden"]) if job.net["kind"] == "mlp"
             else ModelSpec(name="transformer", options=job.net["options"]))
    cfg = TrainConfig(num_workers=WORKERS, backend=backend, epochs=1, batch_size=job.batch, optimizer="adam",
                      lr=job.lr, seed=0, threads_per_worker=1, model=model, overlap=overlap, bucket_mb=BUCKET_MB)
    start = time.perf_counter()
    if job.net["kind"] == "mlp":
        result = train_files(spark, files, cfg)
    else:
        result = train(spark, spark.read.parquet(*files), cfg, inputs=blocksync_inputs())
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "state": result.model.state_dict(),
            "samples_per_sec": result.metrics["samples_per_sec"], "sync_fraction": result.metrics["sync_fraction"]}


def torch_distributor(spark, job: Job, files: list[str]) -> dict[str, Any]:
    from pyspark.ml.torch.distributor import TorchDistributor

    from benchmarks.peer_fns import ddp_train

    start = time.perf_counter()
    state = TorchDistributor(num_processes=WORKERS, local_mode=False, use_gpu=False).run(
        ddp_train, files, job.net, job.batch, 1, job.lr)
    return {"seconds": time.perf_counter() - start, "state": _tensors(state)}


def horovod_spark(spark, job: Job, files: list[str]) -> dict[str, Any]:
    import horovod.spark

    from benchmarks.peer_fns import horovod_train

    start = time.perf_counter()
    states = horovod.spark.run(horovod_train, args=(files, job.net, job.batch, 1, job.lr), num_proc=WORKERS,
                               use_gloo=True, nics=["lo"], start_timeout=120, verbose=0)
    return {"seconds": time.perf_counter() - start, "state": _tensors(states[0])}


def one_process(spark, job: Job, files: list[str]) -> dict[str, Any]:
    """The same loop in this process, on WORKERS threads: what the cores give without any distribution."""
    from benchmarks.peer_fns import _epochs, load, network, state_of

    threads = torch.get_num_threads()
    torch.set_num_threads(WORKERS)
    try:
        start = time.perf_counter()
        x, y = load(files, job.net)
        model = network(job.net)
        opt = torch.optim.Adam(model.parameters(), lr=job.lr)
        _epochs(model, opt, x, y, batch=job.batch, epochs=1, seed=0, rank=0)
        return {"seconds": time.perf_counter() - start, "state": _tensors(state_of(model))}
    finally:
        torch.set_num_threads(threads)


def _tensors(numpy_state: dict) -> dict:
    return {k: torch.from_numpy(v) for k, v in numpy_state.items()}


def contenders() -> dict[str, Any]:
    named: dict[str, Any] = {}
    for backend in ("horovod", "torch_gloo"):
        for overlap in (False, True):
            named[f"blocksync {backend}, overlap {'on' if overlap else 'off'}"] = (
                lambda s, j, f, b=backend, o=overlap: blocksync_run(s, j, f, b, o))
    named[TORCH_DISTRIBUTOR] = torch_distributor
    named["horovod.spark.run (2 processes)"] = horovod_spark
    named[ONE_PROCESS] = one_process
    return named


def accuracy_of(job: Job, state: dict, test_file: str) -> float:
    """Accuracy of a state_dict of blocksync's network on the job's test rows."""
    from benchmarks.peer_fns import TokenNet

    if job.net["kind"] == "mlp":
        return accuracy(state, test_file, job.net["hidden"])
    model = TokenNet(job.net)
    model.net.load_state_dict(state)
    x, y = load_tokens([test_file])
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def run(spark, job: Job = MLP) -> dict:
    files, test_file = job.files()
    named = contenders()
    samples: dict[str, list[dict]] = {name: [] for name in named}
    for rep in range(REPETITIONS):
        for name, fn in named.items():  # alternating
            out = fn(spark, job, files)
            out["accuracy"] = accuracy_of(job, out.pop("state"), test_file)
            samples[name].append(out)
            print(f"rep {rep + 1}/{REPETITIONS} {name}: " + ", ".join(f"{k} {v:.4g}" for k, v in out.items()),
                  flush=True)
    rows = [{"contender": name, **{k: median([o[k] for o in outs]) for k in outs[0]}, "repetitions": len(outs)}
            for name, outs in samples.items()]
    payload = {"rows": rows, "ratios": _ratios({r["contender"]: r for r in rows}), "title": job.title,
               "parameters": sum(p.numel() for p in network(job.net).parameters()),
               "rows_trained": sum(pq.ParquetFile(f).metadata.num_rows for f in files), "batch": job.batch,
               "workers": WORKERS, "bucket_mb": BUCKET_MB,
               "method": f"median over {REPETITIONS} alternating repetitions, wall time from the call to the model"}
    write(job.name, payload, _markdown(payload))
    return payload


def _ratios(by_name: dict[str, dict]) -> dict[str, float]:
    """The ratios the issue asks for: horovod over torch_gloo samples/s, the default over the peers."""
    ratios = {
        f"horovod / torch_gloo samples/s, overlap {o}": by_name[f"blocksync horovod, overlap {o}"]["samples_per_sec"]
        / by_name[f"blocksync torch_gloo, overlap {o}"]["samples_per_sec"] for o in ("off", "on")}
    for name in (TORCH_DISTRIBUTOR, ONE_PROCESS, "blocksync torch_gloo, overlap off"):
        ratios[f"default time / {name}"] = by_name[DEFAULT]["seconds"] / by_name[name]["seconds"]
    for backend in ("horovod", "torch_gloo"):
        ratios[f"{backend} overlap on / off time"] = (by_name[f"blocksync {backend}, overlap on"]["seconds"]
                                                      / by_name[f"blocksync {backend}, overlap off"]["seconds"])
    return ratios


def _markdown(p: dict) -> str:
    lines = [f"# A bigger model: {p['title']} ({p['parameters']:,} parameters)", "",
             f"{p['rows_trained']:,} synthetic rows, batch {p['batch']}, one epoch, {p['workers']} workers with one "
             f"thread each; bucket_mb {p['bucket_mb']} with overlap on. {p['method']}.", "",
             "| contender | time | samples/s (training loop) | sync share | accuracy |",
             "| --- | --- | --- | --- | --- |"]
    for r in p["rows"]:
        rate = f"{r['samples_per_sec']:,.0f}" if "samples_per_sec" in r else "-"
        share = f"{r['sync_fraction']:.2f}" if "sync_fraction" in r else "-"
        lines.append(f"| {r['contender']} | {r['seconds']:.1f} s | {rate} | {share} | {r['accuracy']:.4f} |")
    lines += ["", "| ratio | value |", "| --- | --- |"] + [f"| {k} | {v:.2f} |" for k, v in p["ratios"].items()]
    return "\n".join(lines) + "\n"
