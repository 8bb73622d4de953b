"""A real Spark standalone cluster on 127.0.0.1 from the installed pyspark: one master, N workers.

Started with spark-class (which execs java, so the PIDs we hold are the JVMs)
and stopped by those PIDs only.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyspark

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StandaloneCluster:
    def __init__(
        self, workdir: Path, num_workers: int = 2, cores: int = 2, memory: str = "2g",
        worker_opts: str | None = None, worker_cgroups: list[Path] | None = None,
    ) -> None:
        """`worker_cgroups`: a cgroup folder per worker (e.g. cgroup v1 cpu) that the worker's JVM joins before
        it starts, so its executors and their Python workers, its children, are under that cgroup's limits."""
        self.home = Path(pyspark.__file__).parent
        self.workdir = workdir
        self.port, self.ui_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "SPARK_HOME": str(self.home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(workdir / "logs"),
            "SPARK_WORKER_DIR": str(workdir / "work"),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            # The jobs under tests/jobs import the shared test helpers as `tests.helpers`.
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        }
        if worker_opts:
            self.env["SPARK_WORKER_OPTS"] = worker_opts
        self.procs: list[subprocess.Popen] = []
        self.num_workers, self.cores, self.memory = num_workers, cores, memory
        self.worker_cgroups = worker_cgroups

    def _spawn(self, name: str, *args: str, cgroup: Path | None = None) -> None:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        cmd = [str(self.home / "bin" / "spark-class"), *args]
        join = (lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid()))) if cgroup else None
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           preexec_fn=join))

    def start(self, timeout: float = 90.0) -> StandaloneCluster:
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.ui_port))
        for i in range(self.num_workers):
            self._spawn(f"worker{i}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                        "--cores", str(self.cores), "--memory", self.memory,
                        "--webui-port", str(free_port()), self.url,
                        cgroup=self.worker_cgroups[i] if self.worker_cgroups else None)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.alive_workers() == self.num_workers:
                return self
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"standalone cluster did not come up; logs in {self.workdir}")

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as resp:
                state = json.load(resp)
        except OSError:
            return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def submit(
        self, script: str, *args: str, conf: dict[str, str], timeout: float, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        cmd = [str(self.home / "bin" / "spark-submit"), "--master", self.url]
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        cmd += [script, *args]
        return subprocess.run(cmd, env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=timeout)

    def stop(self) -> None:
        stop_processes(self.procs)


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """Terminate the processes we started (newest first), kill what outlives 30 s, and forget them."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    procs.clear()
