"""The torch_gloo rendezvous' exposure, pinned: torch's TCPStore server offers no bind address, so it listens
on every interface, and blocksync closes it as soon as the process group is up (README, security note)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from blocksync.engine.comm.collectives import Rendezvous, TorchGlooCollective

pytestmark = pytest.mark.timeout(60)


@dataclass
class TaskInfo:
    address: str


class OneTask:
    """BarrierTaskContext's part a single-rank rendezvous uses."""

    def partitionId(self) -> int:  # noqa: N802 (Spark's name)
        return 0

    def getTaskInfos(self) -> list[TaskInfo]:  # noqa: N802 (Spark's name)
        return [TaskInfo("127.0.0.1:0")]


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as the kernel lists them) of sockets in LISTEN state on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def test_the_tcpstore_listens_on_every_interface_only_until_the_group_is_up():
    rendezvous = Rendezvous("torch_gloo", OneTask(), timeout_seconds=20)
    port = rendezvous.port
    assert port
    during = listening_addresses(port)
    # The wildcard address (0.0.0.0, or :: for both families): every interface, not the task's 127.0.0.1.
    assert during and all(set(a) == {"0"} for a in during), during
    collective = TorchGlooCollective(OneTask(), rendezvous, timeout_seconds=20, interface="lo")
    try:
        assert listening_addresses(port) == set()  # closed once the group is up and one collective went through
        assert float(collective.allreduce_sum(torch.ones(3)).sum()) == 3.0  # and the group still works
    finally:
        collective.close()
