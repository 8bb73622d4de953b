"""Training across hosts: three hosts built as network namespaces (tests/netcluster.py), a Spark standalone
worker on each, ranks on distinct addresses. Skipped where namespaces cannot be built (not root)."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from blocksync import ModelSpec, TrainConfig, train
from tests.conftest import synthetic_classification
from tests.netcluster import NetCluster, unavailable_reason
from tests.standalone import stop_processes

REPO = Path(__file__).resolve().parent.parent
REASON = unavailable_reason()
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900),
              pytest.mark.skipif(REASON is not None, reason=REASON or "")]

SETTINGS = dict(num_workers=3, epochs=2, batch_size=48, optimizer="adam", lr=0.01, seed=7, check_every=4,
                model=ModelSpec(name="mlp", hidden=[16]))
# One executor of one core per host: each rank on its own host.
ONE_PER_HOST = {"spark.executor.cores": "1", "spark.executor.memory": "768m", "spark.cores.max": "3",
                "spark.ui.enabled": "false", "spark.python.worker.reuse": "false"}


# A task address that is a hostname resolving to loopback still gets the interface that reaches the peers.
PROBE = ("import socket; from blocksync.engine.comm.collectives import interface_for, local_address; "
         "n = socket.gethostname(); peers = ['host2', 'host3']; "
         "print(n, socket.gethostbyname(n), local_address(n, peers), interface_for(n, None, peers))")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("netdata") / "data.parquet"
    synthetic_classification(600, 8, 3, seed=11).to_parquet(path)
    return str(path)


@pytest.fixture(scope="module")
def local_runs(spark, data) -> dict[str, list[torch.Tensor]]:
    """The same training in local[4], per backend: what the hosts must reproduce."""
    df = spark.read.parquet(data)
    return {backend: [p.detach().flatten() for p in train(spark, df, TrainConfig(**SETTINGS, backend=backend))
                      .model.parameters()] for backend in ("horovod", "torch_gloo")}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[NetCluster]:
    """Three hosts whose names resolve to their own addresses, shared by this module's tests: each submits
    its own application, so only the namespaces and the standalone daemons are shared. The pulled-cable
    test restores the link it takes down."""
    with NetCluster(tmp_path_factory.mktemp("netcluster"), hosts=3).start() as net:
        yield net


@contextlib.contextmanager
def hosts_named(request, tmp_path: Path, hostnames: str) -> Iterator[NetCluster]:
    if hostnames == "own":
        yield request.getfixturevalue("cluster")
        return
    with NetCluster(tmp_path, hosts=3, hostnames=hostnames).start() as net:
        yield net


@pytest.mark.parametrize("hostnames", ["loopback", "own"])
def test_three_hosts_train_like_local_mode(request, tmp_path, data, local_runs, hostnames):
    """`loopback`: each host's name resolves to 127.0.1.1 (Debian's default), where an unpatched
    Horovod 0.28.1 pairs its process-set context over loopback and cannot connect."""
    out = tmp_path / "report.json"
    settings = {**{k: v for k, v in SETTINGS.items() if k != "model"}, "model": {"name": "mlp", "hidden": [16]},
                "backends": ["horovod", "torch_gloo"], "abort_check": hostnames == "own"}
    with hosts_named(request, tmp_path, hostnames) as net:
        proc = net.submit(str(REPO / "tests" / "jobs" / "netcluster_job.py"), str(out), data, json.dumps(settings),
                          conf=ONE_PER_HOST, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        hosts = {net.address(h) for h in (1, 2, 3)}
        # What a process on host 1 sees: its name, what the name resolves to, and what blocksync picks.
        probe = net.run(1, sys.executable, "-c", PROBE, timeout=60)
        assert probe.returncode == 0, probe.stderr
        own_ip = "127.0.1.1" if hostnames == "loopback" else net.address(1)
        assert probe.stdout.split() == ["host1", own_ip, net.address(1), net.veth(1)]
    report = json.loads(out.read_text())
    if hostnames == "own":
        # A Gloo abort inside a worker reaches the user as Gloo's own message, naming the rank.
        assert re.match(r"training failed: rank \d's Python worker died: \[\S*gloo/transport/tcp/pair.cc:\d+\] "
                        r"connect \[127.0.0.1\]:\d+", report.pop("abort") or ""), report.get("abort")
    for backend, run in report.items():
        addresses = {a.split(":")[0] for a in run["task_addresses"]}
        assert addresses == hosts, (backend, run["task_addresses"])  # one rank per host
        assert len(set(run["digests"])) == 1, backend  # the replicas are identical
        diff = max(float((torch.tensor(p) - q).abs().max()) for p, q in
                   zip(run["params"], local_runs[backend], strict=True))
        assert diff <= 1e-5, (backend, diff)


def wait_for_file(path: Path, proc, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, f"the job ended before {path} appeared"
        assert time.monotonic() < deadline, f"{path} did not appear within {seconds} s"
        time.sleep(0.1)


def test_a_pulled_cable_is_named_then_relaunched_once_the_link_is_back(tmp_path, data, cluster):
    step_seconds = 6
    settings = {**{k: v for k, v in SETTINGS.items() if k != "model"}, "model": {"name": "mlp", "hidden": [16]},
                "epochs": 8, "backend": "torch_gloo", "timeouts": {"step_seconds": step_seconds},
                # About 60 ms a step (not 1 ms): the cut lands mid-run, after the step-5 checkpoint the test
                # waits for (seen in CI: a run 3 of 1 ms steps ended between two polls of the file).
                "faults": {"slow_rank": 0, "slow_ms": 60}}
    out, log, net = tmp_path / "report.json", tmp_path / "job.log", cluster
    proc = net.submit_background(str(REPO / "tests" / "jobs" / "netfault_job.py"), str(out), data,
                                 json.dumps(settings), str(tmp_path), conf=ONE_PER_HOST, log=log)
    try:
        # Run 2: cut host 2 after the step-5 checkpoint; restarts exhausted, it must fail naming that host.
        wait_for_file(tmp_path / "ckpt-exhaust" / "step-000000005" / "manifest.json", proc, 300)
        net.set_link(2, up=False)
        wait_for_file(tmp_path / "exhausted.json", proc, 120)
        net.set_link(2, up=True)
        # Run 3: the same cut, the link back after the watchdog fired; the relaunch must finish the run.
        wait_for_file(tmp_path / "ckpt-relaunch" / "step-000000005" / "manifest.json", proc, 300)
        net.set_link(2, up=False)
        time.sleep(step_seconds + 8)
        net.set_link(2, up=True)
        proc.wait(timeout=400)
    finally:  # the shared cluster goes on: its link back, this job ended
        net.set_link(2, up=True)
        stop_processes([proc])
    assert proc.returncode == 0, log.read_text()[-4000:]
    net.wait_for_workers(60)
    report = json.loads(out.read_text())
    assert re.match(rf"training failed: stalled: rank \d on {re.escape(net.address(2))} at step \d+ \(\w+\), "
                    r"silent for [\d.]+ s: its heartbeats stopped", report["exhausted"] or ""), report["exhausted"]
    assert min(report["resumed_at"]) >= 5 and len(set(report["resumed_at"])) == 1, report["resumed_at"]
    assert report["max_param_diff"] == 0.0  # bitwise equal to the clean run on CPU
    assert report["faulty_history"] == report["clean_history"]


def test_checkpoints_on_an_s3_server_on_another_host_survive_a_lost_worker(tmp_path, data, cluster):
    settings = {**{k: v for k, v in SETTINGS.items() if k != "model"}, "model": {"name": "mlp", "hidden": [16]},
                "epochs": 3, "backend": "horovod"}
    out = tmp_path / "report.json"
    s3_env = cluster.start_s3(host=0)
    conf = {**ONE_PER_HOST, **{f"spark.executorEnv.{k}": v for k, v in s3_env.items()}}
    proc = cluster.submit(str(REPO / "tests" / "jobs" / "s3_job.py"), str(out), data, json.dumps(settings),
                          conf=conf, env=s3_env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["resumed_at"] == [10, 10, 10], report  # from the step-10 checkpoint, read back from S3
    assert report["max_param_diff"] == 0.0 and report["same_history"]
    # The newest two checkpoints, each committed by its manifest (written last; no renames on S3).
    steps = sorted({p.split("/")[2] for p in report["checkpoint_objects"]})
    assert steps == ["step-000000030", "step-000000035"], report["checkpoint_objects"]  # of 39 steps
    for step in steps:
        names = {p.rsplit("/", 1)[1] for p in report["checkpoint_objects"] if f"/{step}/" in p}
        assert names == {"manifest.json", "state.safetensors", *(f"rank-{r:05d}.safetensors" for r in range(3))}


def python_listeners(net: NetCluster, host: int) -> list[str]:
    """Local addresses of the TCP sockets Python processes listen on, on `host` (ss in its namespace)."""
    proc = subprocess.run(["ip", "netns", "exec", net.ns(host), "ss", "-Hltnp"], capture_output=True, text=True,
                          check=True)
    return [line.split()[3] for line in proc.stdout.splitlines() if "python" in line]


def test_after_start_up_workers_listen_only_on_their_task_address(tmp_path, data, cluster):
    """torch's TCPStore listens on every interface while the group forms (torch offers no bind address);
    blocksync closes it once every rank has joined. After that, from step 5 on, every socket a Python
    process listens on is bound to its host's own address (Gloo pairs) or to 127.0.0.1 (PySpark's daemon)."""
    settings = {**{k: v for k, v in SETTINGS.items() if k != "model"}, "model": {"name": "mlp", "hidden": [16]}}
    out, log = tmp_path / "report.json", tmp_path / "job.log"
    seen: dict[str, dict[int, list[str]]] = {}
    net = cluster
    proc = net.submit_background(str(REPO / "tests" / "jobs" / "exposure_job.py"), str(out), data,
                                 json.dumps(settings), str(tmp_path), conf=ONE_PER_HOST, log=log)
    try:
        for backend in ("torch_gloo", "horovod"):
            wait_for_file(tmp_path / f"ckpt-{backend}" / "step-000000005" / "manifest.json", proc, 300)
            seen[backend] = {h: python_listeners(net, h) for h in range(4)}
        proc.wait(timeout=300)
    finally:
        stop_processes([proc])
    assert proc.returncode == 0, log.read_text()[-4000:]
    addresses = {h: net.address(h) for h in range(4)}
    report = json.loads(out.read_text())
    for backend, hosts in seen.items():
        assert sorted(a.split(":")[0] for a in report[backend]) == sorted(addresses[h] for h in (1, 2, 3))
        if backend == "torch_gloo":  # its Gloo device listens on the task's address while training runs
            for h in (1, 2, 3):
                assert any(a.startswith(addresses[h] + ":") for a in hosts[h]), (h, hosts[h])
        for host, listeners in hosts.items():
            allowed = {addresses[host], "127.0.0.1"}
            assert {a.rsplit(":", 1)[0] for a in listeners} <= allowed, (backend, host, listeners)
