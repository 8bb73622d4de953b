"""Scaling model: projected efficiency for 2 to 64 workers on 10, 25 and 100 GbE, from measured costs.

Inputs measured on this machine in the same `make bench` run
(results/throughput.json and results/compression.json, so those run first):

- compute: seconds per training sample for one worker with one thread,
  from the 1-worker blocksync row of the throughput benchmark (its step period
  over its batch; with one worker the collective costs next to nothing);
- S: the bytes each rank all-reduces per step (the `none` row of the
  compression benchmark: every gradient, float32).

Model, per step of a worker holding b rows of the batch (weak scaling):

    T_compute = b * compute
    T_allreduce(N) = 2 (N - 1) / N * S / B          the ring floor
                   + 2 (N - 1) * alpha + cycle       latency
    efficiency(N) = T_compute / (T_compute + T_allreduce(N))

When results/netcluster.json exists (`make bench` runs it first, as root), the
latency and bandwidth terms are re-fitted to Horovod's all-reduce measured on 3
namespace hosts with 1 Gbit/s links: T_allreduce(N) = a x floor + 2 (N - 1) x h,
with a and h from that fit. Otherwise, or for what the fit cannot say:

Assumptions, stated because they decide the answer: one worker per host, so
every ring hop crosses the network; B is the link's full line rate (10, 25,
100 Gbit/s), i.e. the floor; alpha = 30 us per hop (TCP on a data-centre
network); cycle = 1 ms (blocksync's default HOROVOD_CYCLE_TIME: a ready tensor
may wait up to one cycle); no overlap of compute and communication (blocksync
fuses all gradients into one all-reduce after the backward pass); compute per
sample does not change with N. Two per-worker batches are shown: 2,048 rows
(the throughput benchmark's 2-worker split) and 64 rows (communication-bound).
"""

from __future__ import annotations

import json

from benchmarks.common import RESULTS, figure, save_figure, write

LINKS_GBIT = [10, 25, 100]
WORKERS = [2, 4, 8, 16, 32, 64]
BATCHES = [2048, 64]
ALPHA_S = 30e-6
CYCLE_S = 1e-3


def allreduce_seconds(n: int, size_bytes: float, link_gbit: float, fit: dict[str, float] | None = None) -> float:
    """The ring model above; with `fit` (from the shaped-link measurement) its bandwidth factor and per-hop cost."""
    bandwidth = link_gbit * 1e9 / 8
    if fit is None:
        return 2 * (n - 1) / n * size_bytes / bandwidth + 2 * (n - 1) * ALPHA_S + CYCLE_S
    return fit["bandwidth_factor"] * 2 * (n - 1) / n * size_bytes / bandwidth + 2 * (n - 1) * fit["hop_seconds"]


def measured_fit() -> dict[str, float] | None:
    """Horovod's all-reduce on 3 namespace hosts at 1 Gbit/s (results/netcluster.json), fitted as
    t = a x floor + c; c spread over the ring's 2(N-1) = 4 hops. None before that benchmark has run."""
    path = RESULTS / "netcluster.json"
    if not path.exists():
        return None
    fit = json.loads(path.read_text())["allreduce_fit"]["1gbit"]["horovod"]
    return {"bandwidth_factor": fit["bandwidth_factor"], "hop_seconds": fit["fixed_seconds"] / 4}


def run(spark=None) -> dict:
    fit = measured_fit()
    throughput = json.loads((RESULTS / "throughput.json").read_text())
    compression = json.loads((RESULTS / "compression.json").read_text())
    one = next(r for r in throughput["rows"] if r["contender"] == "horovod" and r["workers"] == 1)
    per_sample = 1.0 / one["samples_per_sec"]
    size = next(r for r in compression["rows"] if r["mode"] == "none")["payload_bytes_per_step"]
    rows = []
    for batch in BATCHES:
        for link in LINKS_GBIT:
            for n in WORKERS:
                compute, comm = batch * per_sample, allreduce_seconds(n, size, link, fit)
                rows.append({"batch_per_worker": batch, "link_gbit": link, "workers": n, "compute_ms": 1e3 * compute,
                             "allreduce_ms": 1e3 * comm, "efficiency": compute / (compute + comm)})
    comm_model = (f"all-reduce fitted on 3 shaped hosts at 1 Gbit/s (results/netcluster.json): "
                  f"{fit['bandwidth_factor']:.2f} x the ring floor + {1e6 * fit['hop_seconds']:.0f} us per hop"
                  if fit else f"ring floor + {ALPHA_S * 1e6:.0f} us per hop + {CYCLE_S * 1e3:.0f} ms cycle (assumed)")
    payload = {"rows": rows, "seconds_per_sample": per_sample, "allreduce_bytes": size, "alpha_s": ALPHA_S,
               "cycle_s": CYCLE_S, "allreduce_fit": fit, "communication_model": comm_model,
               "inputs": "results/throughput.json (1 horovod worker), results/compression.json, "
                         "results/netcluster.json when present"}
    lines = ["# Scaling projection (model, not a measurement)", "",
             f"Measured inputs: {1e6 * per_sample:.1f} us of compute per sample (one worker, one thread); "
             f"{size:,.0f} B all-reduced per step; {comm_model}. Assumptions: benchmarks/scaling.py.", "",
             "| batch per worker | link | " + " | ".join(f"N={n}" for n in WORKERS) + " |",
             "| --- | --- | " + " | ".join("---" for _ in WORKERS) + " |"]
    for batch in BATCHES:
        for link in LINKS_GBIT:
            effs = [r["efficiency"] for r in rows if r["batch_per_worker"] == batch and r["link_gbit"] == link]
            lines.append(f"| {batch} | {link} GbE | " + " | ".join(f"{100 * e:.1f}%" for e in effs) + " |")
    write("scaling", payload, "\n".join(lines) + "\n")
    fig, ax = figure()
    for batch, style in zip(BATCHES, ["-", "--"], strict=True):
        for link in LINKS_GBIT:
            mine = [r for r in rows if r["batch_per_worker"] == batch and r["link_gbit"] == link]
            ax.plot([r["workers"] for r in mine], [100 * r["efficiency"] for r in mine], style, marker="o",
                    label=f"{link} GbE, {batch} rows/worker")
    ax.set(xscale="log", xlabel="workers", ylabel="projected scaling efficiency (%)", ylim=(0, 105),
           title="projection from measured compute and all-reduce bytes")
    ax.set_xticks(WORKERS, [str(n) for n in WORKERS])
    ax.legend(fontsize=8)
    save_figure(fig, "scaling")
    return payload
