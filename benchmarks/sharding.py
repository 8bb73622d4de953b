"""Sharded optimizer state (shard=optimizer, ZeRO stage 1) against the replicated run: memory, bytes, speed.

blocksync's `mlp` 128 -> 4096 -> 4096 -> 1024 -> 2 (21,509,122 parameters, 86 MB of float32) with Adam,
horovod workers on local[4] at N = 1, 2 and 4, one thread each, global batch 64, STEPS steps on
seeded random rows (the blocks cut once per N and cached). Per N, replicated and sharded runs alternate,
REPETITIONS of each. Each run reports, per rank: the optimizer state's bytes (the tensors Adam keeps),
the peak anonymous memory (RssAnon, sampled every 20 ms by the worker from the task's start: the block,
the model, its gradients, the buffers and the optimizer), that peak less the RssAnon once the model was
built (what training added) beside the README's arithmetic for it, the bytes the exchange formula counts per step,
and the steady samples/s (rank 0's median step period after WARMUP steps).

Wire bytes are also measured by the OS, for both Gloo backends at N = 2 and 4: a barrier stage builds
the same model, and each rank reads its `wchar` from /proc/self/io (bytes written by write/writev,
which Gloo's TCP pairs use) around EXCHANGES replicated exchanges (one all-reduce) and as many
sharded ones (reduce-scatter, step, all-gather).
"""

from __future__ import annotations

import json
import statistics

import numpy as np
import pandas as pd

from benchmarks.common import figure, median, save_figure, steady_step_seconds, write

FEATURES = 128
HIDDEN = [4096, 4096, 1024]
BATCH = 64
STEPS = 12
WARMUP = 3
WORKERS = [1, 2, 4]
REPETITIONS = 2
EXCHANGES = 3


def frame(spark):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH * STEPS, FEATURES), dtype=np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    return spark.createDataFrame(pd.DataFrame({"features": list(x), "label": y}))


def config(workers: int, shard: str):
    from blocksync import ModelSpec, TrainConfig

    return TrainConfig(num_workers=workers, backend="horovod", epochs=1, batch_size=BATCH, optimizer="adam", lr=1e-4,
                       seed=0, shard=shard, threads_per_worker=1, check_every=0, block_storage="memory",
                       model=ModelSpec(name="mlp", hidden=HIDDEN))


def one(spark, blocks, info, workers: int, shard: str) -> dict:
    from blocksync import train_blocks
    from blocksync.engine.comm.sharding import training_state_bytes

    cfg = config(workers, shard)
    result = train_blocks(spark, blocks, info, cfg)
    m = result.metrics
    num_params = result.rank_summaries[0]["num_params"]
    largest = max(p.numel() for p in result.model.parameters())
    return {"workers": workers, "shard": shard, "num_params": num_params,
            "optimizer_bytes": max(m["optimizer_bytes_per_rank"]), "peak_anon_mb": max(m["peak_anon_mb"]),
            # What training added to the built model, measured and by the arithmetic (`training_state_bytes`).
            "training_anon_mb": max(p - a for p, a in zip(m["peak_anon_mb"], m["anon_at_model_mb"], strict=True)),
            "training_formula_mb": sum(training_state_bytes(num_params, cfg, workers, largest).values()) / 2**20,
            "peak_rss_mb": max(m["peak_rss_mb"]), "wire_bytes_per_step": m["bytes_sent"] / m["steps"] / workers,
            "samples_per_sec": BATCH / steady_step_seconds(result, WARMUP), "train_loss": m["train_loss"]}


def measured_wire(spark, backend: str, workers: int) -> dict:
    """Mean bytes each rank wrote per replicated and per sharded exchange, and the formulas for them."""
    hidden = list(HIDDEN)

    def task(batches):
        import pyarrow as pa
        import torch

        from benchmarks.common import task_collective, written_bytes
        from blocksync import ModelSpec, TrainConfig
        from blocksync.engine.comm.sharding import ShardedOptimizer
        from blocksync.engine.models import build_model

        coll = task_collective(batches, backend)
        torch.manual_seed(0)
        model = build_model(ModelSpec(name="mlp", hidden=hidden), FEATURES, 2)
        grads = [torch.randn_like(p) for p in model.parameters()]
        sharded = ShardedOptimizer(model, TrainConfig(backend=backend, shard="optimizer"), coll)
        views = sharded.gradient_views(list(model.parameters()))
        out = {"rank": coll.rank}
        for mode in ("replicated", "sharded", "replicated", "sharded"):  # the first of each warms Horovod up
            before = written_bytes()
            for _ in range(EXCHANGES):
                if mode == "replicated":
                    flat = torch.cat([g.reshape(-1) for g in grads])
                    coll.allreduce_sum(flat)
                    formula = coll.bytes_per_allreduce(flat.numel() * 4)
                else:
                    for view, grad in zip(views, grads, strict=True):
                        view.copy_(grad)
                    formula = sharded.exchange(1.0)[1]
                    sharded.step()
            out[mode] = {"measured": (written_bytes() - before) / EXCHANGES, "formula": formula}
        coll.close()
        yield pa.RecordBatch.from_pydict({"out": [json.dumps(out)]})

    rows = [json.loads(r["out"]) for r in
            spark.range(workers).repartition(workers).mapInArrow(task, "out string", barrier=True).collect()]
    return {mode: {"measured": statistics.mean(r[mode]["measured"] for r in rows), "formula": rows[0][mode]["formula"]}
            for mode in ("replicated", "sharded")}


def run(spark) -> dict:
    from blocksync.engine.driver.blocks import make_blocks

    df = frame(spark)
    runs = []
    for workers in WORKERS:
        blocks, info = make_blocks(df, features="features", label="label", num_workers=workers, seed=0)
        blocks = blocks.cache()
        blocks.count()
        try:
            for rep in range(REPETITIONS):
                for shard in ("none", "optimizer"):  # alternating
                    out = one(spark, blocks, info, workers, shard)
                    runs.append(out)
                    print(f"N={workers} rep {rep + 1} shard={shard}: optimizer {out['optimizer_bytes'] / 2**20:.1f} "
                          f"MiB, peak anon {out['peak_anon_mb']:.0f} MiB, {out['samples_per_sec']:.1f} samples/s",
                          flush=True)
        finally:
            blocks.unpersist()
    wire = [{"backend": b, "workers": n, **measured_wire(spark, b, n)} for b in ("horovod", "torch_gloo")
            for n in (2, 4)]
    rows = summarize(runs)
    payload = {"model": {"name": "mlp", "features": FEATURES, "hidden": HIDDEN, "num_params": runs[0]["num_params"]},
               "optimizer": "adam", "batch": BATCH, "steps": STEPS, "repetitions": REPETITIONS, "rows": rows,
               "runs": runs, "wire_measured": wire}
    write("sharding", payload, markdown(payload))
    plot(rows)
    return payload


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    for workers in WORKERS:
        med = {s: {k: median([r[k] for r in runs if r["workers"] == workers and r["shard"] == s])
                   for k in ("optimizer_bytes", "peak_anon_mb", "peak_rss_mb", "wire_bytes_per_step",
                             "samples_per_sec", "training_anon_mb", "training_formula_mb")}
               for s in ("none", "optimizer")}
        rows.append({"workers": workers, "replicated": med["none"], "sharded": med["optimizer"],
                     "optimizer_ratio": med["optimizer"]["optimizer_bytes"] / med["none"]["optimizer_bytes"],
                     "anon_saved_mb": med["none"]["peak_anon_mb"] - med["optimizer"]["peak_anon_mb"],
                     "speed_ratio": med["optimizer"]["samples_per_sec"] / med["none"]["samples_per_sec"]})
    return rows


def markdown(payload: dict) -> str:
    params = payload["model"]["num_params"]
    lines = [f"# Sharded optimizer state: mlp {HIDDEN} ({params:,} parameters), Adam, horovod, batch {BATCH}", "",
             "Medians of each rank's largest value over the runs; MiB = 2^20 bytes.", "",
             "| N | optimizer per rank: replicated | sharded | sharded / replicated | peak RssAnon per rank: "
             "replicated | sharded | saved | wire bytes per rank per step: replicated | sharded | samples/s: "
             "replicated | sharded | sharded / replicated |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in payload["rows"]:
        rep, sh = r["replicated"], r["sharded"]
        lines.append(f"| {r['workers']} | {rep['optimizer_bytes'] / 2**20:,.1f} MiB | "
                     f"{sh['optimizer_bytes'] / 2**20:,.1f} MiB | {r['optimizer_ratio']:.3f} | "
                     f"{rep['peak_anon_mb']:,.0f} MiB | {sh['peak_anon_mb']:,.0f} MiB | "
                     f"{r['anon_saved_mb']:,.0f} MiB | "
                     f"{rep['wire_bytes_per_step'] / 2**20:,.1f} MiB | {sh['wire_bytes_per_step'] / 2**20:,.1f} MiB | "
                     f"{rep['samples_per_sec']:,.1f} | {sh['samples_per_sec']:,.1f} | {r['speed_ratio']:.2f} |")
    lines += ["", "Where the bytes go: each rank's peak RssAnon less its RssAnon once the model (and an empty "
              "optimizer) was built: the gradients, optimizer state, exchange buffers, backward's and the step's "
              "temporaries; against the README's arithmetic (`sharding.training_state_bytes`)", "",
              "| N | replicated: measured | arithmetic | sharded: measured | arithmetic |",
              "| --- | --- | --- | --- | --- |"]
    for r in payload["rows"]:
        rep, sh = r["replicated"], r["sharded"]
        lines.append(f"| {r['workers']} | {rep['training_anon_mb']:,.0f} MiB | {rep['training_formula_mb']:,.0f} MiB | "
                     f"{sh['training_anon_mb']:,.0f} MiB | {sh['training_formula_mb']:,.0f} MiB |")
    lines += ["", "Wire bytes per rank per exchange, measured (/proc/self/io wchar) against the formula", "",
              "| backend | N | replicated: measured | formula | sharded: measured | formula | sharded / replicated |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for w in payload["wire_measured"]:
        rep, sh = w["replicated"], w["sharded"]
        lines.append(f"| {w['backend']} | {w['workers']} | {rep['measured'] / 2**20:,.1f} MiB | "
                     f"{rep['formula'] / 2**20:,.1f} MiB | {sh['measured'] / 2**20:,.1f} MiB | "
                     f"{sh['formula'] / 2**20:,.1f} MiB | {sh['measured'] / rep['measured']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict]) -> None:
    fig, (left, right) = figure(9, 3.5, ncols=2)
    n = [r["workers"] for r in rows]
    for key, label in (("replicated", "replicated"), ("sharded", "shard=optimizer")):
        left.plot(n, [r[key]["optimizer_bytes"] / 2**20 for r in rows], "o-", label=label)
        right.plot(n, [r[key]["peak_anon_mb"] for r in rows], "o-", label=label)
    left.set(xlabel="workers", ylabel="MiB", title="optimizer state per rank", xticks=n)
    right.set(xlabel="workers", ylabel="MiB", title="peak RssAnon per rank", xticks=n)
    left.legend()
    save_figure(fig, "sharding")
