"""Several hosts on one machine: Linux network namespaces on a private bridge, with a Spark standalone cluster.

What a multi-host problem needs, reproducible on one root machine:

    with NetCluster(workdir, hosts=3).start() as net:
        proc = net.submit("tests/jobs/netcluster_job.py", out, conf={...})
        net.shape(1, "100mbit")        # host 1's egress through tc tbf
        net.set_link(2, up=False)      # host 2's cable pulled
        s3_env = net.start_s3()        # an S3 server (moto) on the driver host

Layout (P is a per-run prefix, so parallel runs never share anything):

    P-sw   holds only the bridge `br0`: the switch
    P-0    the driver host, 10.213.0.10: the Spark master and spark-submit
    P-1..  worker hosts, 10.213.0.11, .12, ...: one Spark standalone worker each

Each host namespace has `lo` and one veth whose peer sits on the bridge. No
link reaches the machine's own namespace, so traffic cannot leave the
namespaces and the bridge. Each process runs in its host's namespace and in a
UTS namespace of its own, so each host has its own hostname (`driver`,
`host1`, ...). `hostnames="own"` writes an /etc/hosts (bind-mounted by
`ip netns exec` from /etc/netns/NS/hosts) where every name resolves to its
host's address; `hostnames="loopback"` makes each host's own name resolve to
127.0.1.1, as Debian's default does, the others' to their addresses.

`stop()` (also on leaving the `with` block, on failure too) terminates every
process still in the namespaces, by PID, then deletes the namespaces (which
takes their veths along) and the /etc/netns files.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyspark

from tests.standalone import stop_processes

REPO = Path(__file__).resolve().parents[1]
SUBNET = "10.213.0"
MASTER_PORT, MASTER_UI_PORT = 7077, 8080


def unavailable_reason() -> str | None:
    """Why namespaces cannot be built here (None when they can): tests skip with this reason."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN); run the tests as root"
    if shutil.which("ip") is None or shutil.which("unshare") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) and util-linux (unshare) are needed for network namespaces"
    probe = f"bsprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _sh(*cmd: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    return proc.stdout


class NetCluster:
    def __init__(self, workdir: Path, hosts: int = 3, *, hostnames: str = "own", cores: int = 1,
                 memory: str = "1g") -> None:
        assert hostnames in ("own", "loopback")
        self.workdir, self.num_hosts, self.hostnames = workdir, hosts, hostnames
        self.cores, self.memory = cores, memory
        self.prefix = f"bs{uuid.uuid4().hex[:5]}"
        self.home = Path(pyspark.__file__).parent
        self.procs: list[subprocess.Popen] = []
        self.made: list[str] = []

    # --- names and addresses -------------------------------------------------------------
    def ns(self, host: int) -> str:
        return f"{self.prefix}-{host}"

    def address(self, host: int) -> str:
        return f"{SUBNET}.{10 + host}"

    def hostname(self, host: int) -> str:
        return "driver" if host == 0 else f"host{host}"

    def veth(self, host: int) -> str:
        return f"{self.prefix}v{host}"  # the host's end; its bridge end is `<veth>p`

    @property
    def master_url(self) -> str:
        return f"spark://{self.address(0)}:{MASTER_PORT}"

    # --- the network ----------------------------------------------------------------------
    def _build_network(self) -> None:
        switch = f"{self.prefix}-sw"
        _sh("ip", "netns", "add", switch)
        self.made.append(switch)
        _sh("ip", "netns", "exec", switch, "ip", "link", "add", "br0", "type", "bridge")
        _sh("ip", "netns", "exec", switch, "ip", "link", "set", "br0", "up")
        for host in range(self.num_hosts + 1):
            ns, veth = self.ns(host), self.veth(host)
            _sh("ip", "netns", "add", ns)
            self.made.append(ns)
            _sh("ip", "link", "add", veth, "netns", ns, "type", "veth", "peer", "name", f"{veth}p", "netns", switch)
            _sh("ip", "netns", "exec", switch, "ip", "link", "set", f"{veth}p", "master", "br0", "up")
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.address(host)}/24", "dev", veth)
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", veth, "up")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            self._write_hosts(host)

    def _write_hosts(self, host: int) -> None:
        lines = ["127.0.0.1 localhost"]
        for other in range(self.num_hosts + 1):
            mine = other == host and self.hostnames == "loopback"
            lines.append(f"{'127.0.1.1' if mine else self.address(other)} {self.hostname(other)}")
        etc = Path("/etc/netns") / self.ns(host)
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text("\n".join(lines) + "\n")

    def shape(self, host: int, rate: str | None) -> None:
        """Rate-limit `host`'s egress with tc tbf (e.g. "100mbit"); None removes the limit."""
        ns, veth = self.ns(host), self.veth(host)
        if rate is None:
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", veth, "root"],
                           capture_output=True)
            return
        _sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", veth, "root", "tbf", "rate", rate,
            "burst", "256kb", "latency", "100ms")

    def set_link(self, host: int, *, up: bool) -> None:
        """Take `host`'s only link down (its cable pulled) or back up."""
        _sh("ip", "netns", "exec", self.ns(host), "ip", "link", "set", self.veth(host), "up" if up else "down")

    # --- processes --------------------------------------------------------------------------
    def command(self, host: int, *cmd: str) -> list[str]:
        """`cmd` as run on `host`: its network namespace, its own hostname (each step execs, so the PID is cmd's)."""
        return ["ip", "netns", "exec", self.ns(host), "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                self.hostname(host), *cmd]

    def env(self, host: int) -> dict[str, str]:
        return {
            **os.environ,
            "SPARK_HOME": str(self.home),
            "SPARK_LOCAL_IP": self.address(host),
            "SPARK_LOG_DIR": str(self.workdir / "logs"),
            "SPARK_WORKER_DIR": str(self.workdir / f"work{host}"),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        }

    def _spawn(self, host: int, name: str, *args: str) -> None:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        cmd = self.command(host, str(self.home / "bin" / "spark-class"), *args)
        self.procs.append(subprocess.Popen(cmd, env=self.env(host), stdout=log, stderr=subprocess.STDOUT))

    def start(self, timeout: float = 120.0) -> NetCluster:
        try:
            self._build_network()
            self._spawn(0, "master", "org.apache.spark.deploy.master.Master", "--host", self.address(0),
                        "--port", str(MASTER_PORT), "--webui-port", str(MASTER_UI_PORT))
            for host in range(1, self.num_hosts + 1):
                self._spawn(host, f"worker{host}", "org.apache.spark.deploy.worker.Worker", "--host",
                            self.address(host), "--cores", str(self.cores), "--memory", self.memory,
                            "--webui-port", "8081", self.master_url)
            self.wait_for_workers(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_for_workers(self, timeout: float) -> None:
        """Until the master counts every host's worker alive (at start, or once a pulled cable is back)."""
        deadline = time.monotonic() + timeout
        while self.alive_workers() < self.num_hosts:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the namespace cluster's workers are not all alive; logs in {self.workdir}")
            time.sleep(1.0)

    def start_s3(self, host: int = 0, port: int = 5000, timeout: float = 60.0) -> dict[str, str]:
        """An S3-compatible object store (moto's server) on `host`; the environment that reaches it."""
        log = open(self.workdir / "s3.log", "wb")  # noqa: SIM115 (closed with the process)
        cmd = self.command(host, sys.executable, "-m", "moto.server", "-H", self.address(host), "-p", str(port))
        self.procs.append(subprocess.Popen(cmd, env=self.env(host), stdout=log, stderr=subprocess.STDOUT))
        s3_env = {"AWS_ENDPOINT_URL": f"http://{self.address(host)}:{port}", "AWS_ACCESS_KEY_ID": "blocksync",
                  "AWS_SECRET_ACCESS_KEY": "blocksync", "AWS_DEFAULT_REGION": "us-east-1"}
        probe = f"import urllib.request as u; u.urlopen({s3_env['AWS_ENDPOINT_URL']!r}, timeout=2)"
        deadline = time.monotonic() + timeout
        while self.run(host, sys.executable, "-c", probe, timeout=30).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the S3 server did not come up; see {self.workdir / 's3.log'}")
            time.sleep(0.5)
        return s3_env

    def alive_workers(self) -> int:
        url = f"http://{self.address(0)}:{MASTER_UI_PORT}/json/"
        probe = (f"import json, urllib.request as u; s = json.load(u.urlopen({url!r}, timeout=2)); "
                 "print(sum(w['state'] == 'ALIVE' for w in s['workers']))")
        proc = subprocess.run(["ip", "netns", "exec", self.ns(0), sys.executable, "-c", probe],
                              capture_output=True, text=True)
        return int(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else 0

    def run(self, host: int, *cmd: str, timeout: float, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess:
        """Run `cmd` on `host` to completion."""
        return subprocess.run(self.command(host, *cmd), env={**self.env(host), **(env or {})}, capture_output=True,
                              text=True, timeout=timeout)

    def submit(self, script: str, *args: str, conf: dict[str, str], timeout: float,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """spark-submit `script` from the driver host, in client mode."""
        return self.run(0, *self._submit_command(script, *args, conf=conf), timeout=timeout, env=env)

    def submit_background(self, script: str, *args: str, conf: dict[str, str], log: Path) -> subprocess.Popen:
        """Like `submit`, returning at once (stop() ends it too); its output goes to `log`."""
        with open(log, "wb") as out:
            proc = subprocess.Popen(self.command(0, *self._submit_command(script, *args, conf=conf)),
                                    env=self.env(0), stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def _submit_command(self, script: str, *args: str, conf: dict[str, str]) -> list[str]:
        driver = self.address(0)
        cmd = [str(self.home / "bin" / "spark-submit"), "--master", self.master_url,
               "--conf", f"spark.driver.host={driver}", "--conf", f"spark.driver.bindAddress={driver}"]
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        return [*cmd, script, *args]

    def stop(self) -> None:
        stop_processes(self.procs)
        for ns in self.made:  # executors and Python workers the JVMs left behind: ours, by PID
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), 9)
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        self.made.clear()
        with contextlib.suppress(OSError):
            Path("/etc/netns").rmdir()  # only when no other namespace uses it

    def __enter__(self) -> NetCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
