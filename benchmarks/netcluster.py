"""Communication on shaped links: 3 hosts built as network namespaces (tests/netcluster.py), one rank each.

Every host's egress is shaped with `tc tbf` to 100 Mbit/s, then to 1 Gbit/s; at each rate one
spark-submit of `benchmarks/netcluster_job.py` measures:

- all-reduce seconds per message size, horovod and torch_gloo (rank 0's mean over back-to-back
  all-reduces), against the ring floor 2(N-1)/N x S / B, reported as measured over floor;
- weak scaling from 1 to 3 hosts: steady-state step time (median) of a 200k-parameter MLP with 64
  rows per rank per step; efficiency(N) = samples/s(N) / (N x samples/s(1));
- at 100 Mbit/s, the step time of each compression mode on 3 hosts (horovod).

The machine's cores are shared by all hosts (2 here), so compute does not scale with hosts as it
would on real machines: at 1 Gbit/s the figures are CPU-bound, which the sync share shows. Needs root
(network namespaces); without it the benchmark says why and writes nothing.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from benchmarks.common import figure, save_figure, write

RATES = {"100mbit": 100e6, "1gbit": 1e9}
SIZES = [64 * 1024, 1024 * 1024, 4 * 1024 * 1024, 16 * 1024 * 1024]
CONF = {"spark.executor.cores": "1", "spark.executor.memory": "1g", "spark.cores.max": "3",
        "spark.ui.enabled": "false", "spark.driver.memory": "2g"}
REPO = Path(__file__).resolve().parent.parent


def measure() -> dict[str, dict]:
    from tests.netcluster import NetCluster

    results = {}
    with tempfile.TemporaryDirectory() as tmp, NetCluster(Path(tmp), hosts=3).start() as net:
        for name, rate in RATES.items():
            for host in range(4):
                net.shape(host, name)
            out = Path(tmp) / f"{name}.json"
            params = {"rate_bit": rate, "sizes": SIZES, "compression": name == "100mbit"}
            proc = net.submit(str(REPO / "benchmarks" / "netcluster_job.py"), str(out), json.dumps(params),
                              conf=CONF, timeout=1500)
            if proc.returncode != 0:
                raise RuntimeError(f"netcluster job at {name} failed:\n{proc.stderr[-3000:]}")
            results[name] = json.loads(out.read_text())
            print(f"{name} done", flush=True)
    return results


def fit_allreduce(rows: list[dict]) -> dict[str, float]:
    """Least squares t = a x floor + c over the sizes: a, the bandwidth actually reached over the line
    rate (inverse), and c, the fixed cost per all-reduce on 3 hosts."""
    xs, ts = [r["floor_seconds"] for r in rows], [r["seconds"] for r in rows]
    slope, intercept = statistics.linear_regression(xs, ts)
    return {"bandwidth_factor": slope, "fixed_seconds": max(intercept, 0.0)}


def run(spark=None) -> dict:
    from tests.netcluster import unavailable_reason

    reason = unavailable_reason()
    if reason:  # the other benchmarks still run; the recorded results stay as they are
        print(f"netcluster benchmark skipped: {reason}", flush=True)
        return {}
    results = measure()
    fits = {rate: {b: fit_allreduce([r for r in res["allreduce"] if r["backend"] == b])
                   for b in ("horovod", "torch_gloo")} for rate, res in results.items()}
    for res in results.values():
        for backend in ("horovod", "torch_gloo"):
            mine = [r for r in res["scaling"] if r["backend"] == backend]
            one = next(r for r in mine if r["ranks"] == 1)["samples_per_sec"]
            for r in mine:
                r["efficiency"] = r["samples_per_sec"] / (r["ranks"] * one)
    payload = {"hosts": 3, "results": results, "allreduce_fit": fits,
               "method": "tc tbf on every host's veth; one rank per host; medians of step times"}
    write("netcluster", payload, markdown(results, fits))
    plot(results)
    return payload


def markdown(results: dict, fits: dict) -> str:
    lines = ["# Communication on shaped links: 3 namespace hosts, one rank each", "",
             "## All-reduce against the ring floor 2(N-1)/N x S / B", "",
             "| link | backend | size | measured | floor | measured / floor |", "| --- | --- | --- | --- | --- | --- |"]
    for rate, res in results.items():
        for r in res["allreduce"]:
            lines.append(f"| {rate} | {r['backend']} | {r['bytes'] / 1024:,.0f} KiB | {r['seconds'] * 1e3:.1f} ms "
                         f"| {r['floor_seconds'] * 1e3:.1f} ms | {r['measured_over_floor']:.2f} |")
    lines += ["", "Fit t = a x floor + c: " + "; ".join(
        f"{rate} {b}: a = {f['bandwidth_factor']:.2f}, c = {f['fixed_seconds'] * 1e3:.1f} ms"
        for rate, per in fits.items() for b, f in per.items()), "",
        "## Weak scaling, 64 rows per rank per step (200k-parameter MLP)", "",
        "| link | backend | hosts | step | samples/s | efficiency | sync share |",
        "| --- | --- | --- | --- | --- | --- | --- |"]
    for rate, res in results.items():
        for r in res["scaling"]:
            lines.append(f"| {rate} | {r['backend']} | {r['ranks']} | {r['median_step_seconds'] * 1e3:.1f} ms | "
                         f"{r['samples_per_sec']:.0f} | {100 * r['efficiency']:.0f}% | "
                         f"{100 * r['sync_fraction']:.0f}% |")
    lines += ["", "## Compression at 100 Mbit/s, 3 hosts, horovod", "",
              "| mode | payload per step | step | vs none |", "| --- | --- | --- | --- |"]
    comp = results["100mbit"]["compression"]
    base = next(r for r in comp if r["compression"] == "none")["median_step_seconds"]
    for r in comp:
        lines.append(f"| {r['compression']} | {r['payload_bytes_per_step']:,.0f} B | "
                     f"{r['median_step_seconds'] * 1e3:.1f} ms | {r['median_step_seconds'] / base:.2f}x |")
    return "\n".join(lines) + "\n"


def plot(results: dict) -> None:
    fig, (left, right) = figure(width=11, ncols=2)
    for rate, res in results.items():
        for backend, marker in (("horovod", "o"), ("torch_gloo", "s")):
            mine = [r for r in res["allreduce"] if r["backend"] == backend]
            left.plot([r["bytes"] / 1024 for r in mine], [r["measured_over_floor"] for r in mine], marker=marker,
                      label=f"{backend}, {rate}")
            scale = [r for r in res["scaling"] if r["backend"] == backend]
            right.plot([r["ranks"] for r in scale], [100 * r["efficiency"] for r in scale], marker=marker,
                       label=f"{backend}, {rate}")
    left.set(xscale="log", xlabel="message size (KiB)", ylabel="measured / ring floor",
             title="all-reduce on shaped links, 3 hosts")
    right.set(xlabel="hosts (one rank each)", ylabel="weak-scaling efficiency (%)", ylim=(0, 110),
              title="samples/s(N) / (N x samples/s(1))")
    right.set_xticks([1, 2, 3])
    for ax in (left, right):
        ax.legend(fontsize=8)
    save_figure(fig, "netcluster")
