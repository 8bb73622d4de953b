"""An SFTP server on 127.0.0.1 for the tests: OpenSSH's sshd, started and stopped by PID.

It is a real remote filesystem for Spark's Hadoop layer: pyspark's own jars hold Hadoop's SFTPFileSystem
(with a shaded JSch), so a run directory given as an `sftp://` URI is written by Spark's DataFrame writers and by
the driver through the same filesystem, over the network, with nothing mounted. What the server stores lies in a
local folder, where the tests read it back.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def unavailable_reason() -> str | None:
    if not Path(SSHD).exists():
        return f"{SSHD} not found: install openssh-server (scripts/test_services.sh does, as root)"
    if not shutil.which("ssh-keygen"):
        return "ssh-keygen not found: install openssh-client"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SftpServer:
    """`with SftpServer(folder) as server:` serves this machine's filesystem to the user running the tests."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = _free_port()
        self.user = getpass.getuser()
        self.key = folder / "client_key"
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> SftpServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        # JSch, as shaded in Hadoop, speaks ECDSA keys (PEM for the client key), not ed25519.
        for key, extra in ((self.folder / "host_key", []), (self.key, ["-m", "PEM"])):
            subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", *extra, "-f", str(key)], check=True)
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation folder
        for _ in range(3):  # the free port was free when asked; another process may take it before sshd binds it
            if self._start():
                return self
            self.port = _free_port()
        raise RuntimeError(f"sshd did not start: {(self.folder / 'sshd.log').read_text()[-2000:]}")

    def _start(self) -> bool:
        """Start sshd on `self.port`; False if it exits before it listens."""
        config = self.folder / "sshd_config"
        config.write_text(f"ListenAddress 127.0.0.1\nPort {self.port}\nHostKey {self.folder / 'host_key'}\n"
                          f"AuthorizedKeysFile {self.key}.pub\nPasswordAuthentication no\n"
                          "PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
                          f"Subsystem sftp internal-sftp\nPidFile {self.folder / 'sshd.pid'}\n")
        self._log = (self.folder / "sshd.log").open("wb")
        self._proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=self._log)
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as probe:
                    banner = probe.recv(64)
                if banner.startswith(b"SSH-") and self._proc.poll() is None:  # sshd's, not another listener's
                    return True
                raise ConnectionError(f"not sshd on port {self.port}: {banner!r}")
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    return False
                time.sleep(0.1)

    def uri(self, path: Path) -> str:
        return f"sftp://{self.user}@127.0.0.1:{self.port}{path.resolve()}"

    def spark_conf(self) -> dict[str, str]:
        """The Spark settings that give Hadoop the SFTP filesystem and the client key."""
        return {"spark.hadoop.fs.sftp.impl": "org.apache.hadoop.fs.sftp.SFTPFileSystem",
                "spark.hadoop.fs.sftp.keyfile": str(self.key)}

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()  # sshd -D ends its sessions with it
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        self._log.close()
