"""Gradient compression: bytes per step and time per step for each mode.

blocksync's `mlp` (128 -> 256 -> 256 -> 2, 99,330 parameters), 4 horovod workers
on local[4], global batch 4,096, one epoch over the first 262,144 synthetic rows
(64 steps), blocks cut once and cached. Per mode: the all-reduce payload per
step (what each rank hands the collective), rank 0's median step period and
median time inside the collective after 10 warm-up steps, and the final
training loss. Modes alternate within each repetition.
"""

from __future__ import annotations

import statistics

from benchmarks.common import cached_blocks, figure, median, save_figure, steady_step_seconds, write
from benchmarks.data import synthetic

MODES = ["none", "fp16", "int8", "topk"]
WORKERS = 4
BATCH = 4096
WARMUP = 10
REPETITIONS = 3


def one(spark, blocks, info, mode: str) -> dict:
    from blocksync import ModelSpec, TrainConfig, train_blocks

    result = train_blocks(spark, blocks, info, TrainConfig(
        num_workers=WORKERS, backend="horovod", epochs=1, batch_size=BATCH, optimizer="adam", lr=1e-3, seed=0,
        compression=mode, topk_ratio=0.01, threads_per_worker=1, model=ModelSpec(name="mlp", hidden=[256, 256])))
    sync = statistics.median(t[3] for t in result.rank_summaries[0]["step_timings"][WARMUP:])
    return {"payload_bytes": result.metrics["payload_bytes_per_step"], "step_s": steady_step_seconds(result, WARMUP),
            "sync_s": sync, "loss": result.metrics["train_loss"]}


def run(spark) -> dict:
    data = synthetic()
    blocks, info = cached_blocks(spark, data.train_files[:2], WORKERS)
    samples: dict[str, list[dict]] = {m: [] for m in MODES}
    try:
        for rep in range(REPETITIONS):
            for mode in MODES:
                out = one(spark, blocks, info, mode)
                samples[mode].append(out)
                print(f"rep {rep + 1}/{REPETITIONS} {mode}: {out['payload_bytes']:.0f} B/step, "
                      f"{1e3 * out['step_s']:.1f} ms/step", flush=True)
    finally:
        blocks.unpersist()
    medians = {m: {k: median([o[k] for o in outs]) for k in outs[0]} for m, outs in samples.items()}
    base = medians["none"]
    rows = [{"mode": m, "payload_bytes_per_step": v["payload_bytes"], "step_ms": 1e3 * v["step_s"],
             "sync_ms": 1e3 * v["sync_s"], "train_loss": v["loss"], "repetitions": len(samples[m]),
             "bytes_ratio_to_none": v["payload_bytes"] / base["payload_bytes"],
             "time_ratio_to_none": v["step_s"] / base["step_s"]}
            for m, v in medians.items()]
    payload = {"rows": rows, "workers": WORKERS, "global_batch": BATCH, "rows_per_epoch": sum(info.sizes),
               "topk_ratio": 0.01}
    lines = [f"# Compression: mlp [256, 256], {WORKERS} horovod workers on local[{WORKERS}], batch {BATCH}", "",
             "| mode | payload per step | x none | step time | x none | time in all-reduce | final train loss |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['payload_bytes_per_step']:,.0f} B | {r['bytes_ratio_to_none']:.3f} "
                     f"| {r['step_ms']:.1f} ms | {r['time_ratio_to_none']:.2f} | {r['sync_ms']:.1f} ms "
                     f"| {r['train_loss']:.4f} |")
    write("compression", payload, "\n".join(lines) + "\n")
    fig, (left, right) = figure(9, 3.5, ncols=2)
    left.bar(MODES, [r["payload_bytes_per_step"] for r in rows])
    left.set(yscale="log", ylabel="bytes per step", title="all-reduce payload")
    right.bar(MODES, [r["step_ms"] for r in rows], label="step")
    right.bar(MODES, [r["sync_ms"] for r in rows], label="of which all-reduce")
    right.set(ylabel="ms", title="time per step (median)")
    right.legend()
    save_figure(fig, "compression")
    return payload
