"""Gradient compression: bytes per step and time per step for each mode.

blocksync's `mlp` (128 -> 256 -> 256 -> 2, 99,330 parameters), 4 horovod workers
on local[4], global batch 4,096, one epoch over the first 262,144 synthetic rows
(64 steps), blocks cut once and cached. Per mode: the all-reduce payload per
step (what each rank hands the collective), rank 0's median step period and
median time inside the collective after 10 warm-up steps, and the final
training loss. Modes alternate within each repetition.

Wire bytes per rank: each scheme's formula (`compression.wire_bytes`: ring
all-reduce 2(N-1)/N x payload, all-gather (N-1) x payload) for N = 4, 16 and
64, checked at N = 4 against bytes measured by the OS: a barrier stage of 4
horovod ranks runs the scheme's `exchange` on random gradients of the same
model, and each rank reads its `wchar` from /proc/self/io (bytes written by
write/writev, which Gloo's TCP pairs use) around 10 exchanges.
"""

from __future__ import annotations

import statistics

from benchmarks.common import cached_blocks, figure, median, save_figure, steady_step_seconds, write
from benchmarks.data import synthetic

MODES = ["none", "fp16", "int8", "topk", "powersgd"]
PROJECTED_WORKERS = [4, 16, 64]
HIDDEN = [256, 256]
CLASSES = 2  # benchmarks.data.synthetic labels rows 0 or 1
WORKERS = 4
BATCH = 4096
WARMUP = 10
REPETITIONS = 3


def one(spark, blocks, info, mode: str) -> dict:
    from blocksync import ModelSpec, TrainConfig, train_blocks

    result = train_blocks(spark, blocks, info, TrainConfig(
        num_workers=WORKERS, backend="horovod", epochs=1, batch_size=BATCH, optimizer="adam", lr=1e-3, seed=0,
        compression=mode, topk_ratio=0.01, threads_per_worker=1, model=ModelSpec(name="mlp", hidden=HIDDEN)))
    sync = statistics.median(t[3] for t in result.rank_summaries[0]["step_timings"][WARMUP:])
    return {"payload_bytes": result.metrics["payload_bytes_per_step"], "step_s": steady_step_seconds(result, WARMUP),
            "sync_s": sync, "loss": result.metrics["train_loss"]}


def measured_wire_bytes(spark, mode: str, num_features: int, num_outputs: int, exchanges: int = 10) -> dict:
    """Mean bytes each of 4 horovod ranks wrote per `exchange`, and the scheme's formula for it."""
    hidden = list(HIDDEN)

    def task(batches):
        import json

        import pyarrow as pa
        import torch

        from benchmarks.common import task_collective, written_bytes
        from blocksync import ModelSpec
        from blocksync.engine.comm.compression import make_compressor
        from blocksync.engine.models import build_model

        coll = task_collective(batches, "horovod")
        shapes = [p.shape for p in build_model(ModelSpec(name="mlp", hidden=hidden), num_features, num_outputs)
                  .parameters()]
        comp = make_compressor(mode, coll, shapes, topk_ratio=0.01, powersgd_rank=4, seed=0)
        gen = torch.Generator().manual_seed(coll.rank)
        grads = [torch.randn(comp.num_params, generator=gen) for _ in range(exchanges + 1)]
        formula = comp.exchange(grads[0], 0).wire_bytes  # warm-up: Horovod's first op of a name negotiates
        before = written_bytes()
        for step in range(1, exchanges + 1):
            comp.exchange(grads[step], step)
        sent = (written_bytes() - before) / exchanges
        coll.close()
        yield pa.RecordBatch.from_pydict({"out": [json.dumps({"rank": coll.rank, "sent": sent, "formula": formula,
                                                              "kind": comp.kind})]})

    import json

    rows = [json.loads(r["out"]) for r in
            spark.range(WORKERS).repartition(WORKERS).mapInArrow(task, "out string", barrier=True).collect()]
    measured = sum(r["sent"] for r in rows) / len(rows)
    return {"measured": measured, "formula": rows[0]["formula"], "kind": rows[0]["kind"]}


def wire_table(spark, info, payloads: dict[str, float]) -> list[dict]:
    from blocksync.engine.comm.compression import wire_bytes

    out = []
    for mode in MODES:
        wire = measured_wire_bytes(spark, mode, info.num_features, CLASSES)
        row = {"mode": mode, "kind": wire["kind"], "measured_n4": wire["measured"], "formula_n4": wire["formula"],
               "measured_over_formula": wire["measured"] / wire["formula"]}
        row.update({f"formula_n{n}": wire_bytes(wire["kind"], payloads[mode], n) for n in PROJECTED_WORKERS})
        out.append(row)
        print(f"{mode}: measured {wire['measured']:,.0f} B/rank/step at N=4, formula {wire['formula']:,.0f}",
              flush=True)
    return out


def wire_markdown(rows: list[dict]) -> list[str]:
    lines = ["", "Wire bytes per rank per step: formula for N workers, measured (/proc/self/io wchar) at N = 4", "",
             "| mode | exchange | N = 4 | N = 16 | N = 64 | measured N = 4 | measured / formula | x none at N = 64 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    none64 = next(r["formula_n64"] for r in rows if r["mode"] == "none")
    for r in rows:
        lines.append(f"| {r['mode']} | {r['kind']} | {r['formula_n4']:,.0f} | {r['formula_n16']:,.0f} "
                     f"| {r['formula_n64']:,.0f} | {r['measured_n4']:,.0f} | {r['measured_over_formula']:.3f} "
                     f"| {r['formula_n64'] / none64:.3f} |")
    return lines


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
    wire = wire_table(spark, info, {r["mode"]: r["payload_bytes_per_step"] for r in rows})
    payload = {"rows": rows, "wire": wire, "workers": WORKERS, "global_batch": BATCH,
               "rows_per_epoch": sum(info.sizes), "topk_ratio": 0.01, "powersgd_rank": 4}
    lines = [f"# Compression: mlp [256, 256], {WORKERS} horovod workers on local[{WORKERS}], batch {BATCH}", "",
             "| mode | payload per step | x none | step time | x none | time in all-reduce | final train loss |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['payload_bytes_per_step']:,.0f} B | {r['bytes_ratio_to_none']:.3f} "
                     f"| {r['step_ms']:.1f} ms | {r['time_ratio_to_none']:.2f} | {r['sync_ms']:.1f} ms "
                     f"| {r['train_loss']:.4f} |")
    write("compression", payload, "\n".join(lines + wire_markdown(wire)) + "\n")
    fig, (left, right) = figure(9, 3.5, ncols=2)
    left.bar(MODES, [r["payload_bytes_per_step"] for r in rows])
    left.set(yscale="log", ylabel="bytes per step", title="all-reduce payload")
    right.bar(MODES, [r["step_ms"] for r in rows], label="step")
    right.bar(MODES, [r["sync_ms"] for r in rows], label="of which all-reduce")
    right.set(ylabel="ms", title="time per step (median)")
    right.legend()
    save_figure(fig, "compression")
    return payload
