"""A memory block that cannot fit the worker's cgroup (how YARN and Kubernetes limit a container) fails with the
block's size and the limit named, instead of the kernel's silent kill."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from blocksync.engine.worker.block_store import cgroup_memory
from tests.helpers import own_memory_cgroup

pytestmark = pytest.mark.timeout(120)


def fake_hierarchy(tmp_path: Path, version: int, limit: str, stat: str) -> tuple[str, str]:
    if version == 1:
        proc = "4:memory:/yarn/container_1\n0::/\n"
        folder, limit_file = tmp_path / "memory" / "yarn" / "container_1", "memory.limit_in_bytes"
    else:
        proc = "0::/kubepods/pod1\n"
        folder, limit_file = tmp_path / "kubepods" / "pod1", "memory.max"
    folder.mkdir(parents=True)
    (folder / limit_file).write_text(limit + "\n")
    (folder / "memory.stat").write_text(stat)
    (tmp_path / "cgroup").write_text(proc)
    return str(tmp_path / "cgroup"), str(tmp_path)


@pytest.mark.parametrize("version,stat", [(1, "cache 900\nrss 300\ntotal_rss 400\n"), (2, "anon 400\nfile 900\n")])
def test_the_limit_and_the_memory_the_kernel_cannot_reclaim_are_read(tmp_path, version, stat):
    proc, root = fake_hierarchy(tmp_path, version, "1048576", stat)
    assert cgroup_memory(proc, root) == (1048576, 400)  # page cache (cache, file) is reclaimable: not counted


@pytest.mark.parametrize("version,unlimited", [(1, "9223372036854771712"), (2, "max")])
def test_no_limit_is_none(tmp_path, version, unlimited):
    proc, root = fake_hierarchy(tmp_path, version, unlimited, "rss 1\nanon 1\n")
    assert cgroup_memory(proc, root) is None


CHECK = """
import os, sys
open(sys.argv[1] + "/cgroup.procs", "w").write(str(os.getpid()))
from blocksync.engine.worker.block_store import check_block_fits
check_block_fits(1000, 16)  # 70 KB: fits
try:
    check_block_fits(4_000_000, 256)  # 3,937 MiB against a 512 MiB limit
except MemoryError as err:
    print(err)
"""


def test_a_block_larger_than_the_cgroup_limit_is_refused_naming_both():
    parent = own_memory_cgroup()
    if parent is None:
        pytest.skip("no writable cgroup v1 memory controller here (needs root)")
    child = parent / f"blocksync-test-{os.getpid()}"
    child.mkdir()
    try:
        (child / "memory.limit_in_bytes").write_text(str(512 * 2**20))
        proc = subprocess.run([sys.executable, "-c", CHECK, str(child)], capture_output=True, text=True, timeout=60)
    finally:
        child.rmdir()  # the subprocess has exited, so the cgroup is empty
    assert proc.returncode == 0, proc.stderr[-2000:]
    message = proc.stdout.strip()
    assert message.startswith("block_storage=memory: this block of 3,937 MiB (4000000 rows) does not fit in this "
                              "worker's cgroup memory limit of 512 MiB ("), message
    assert message.endswith("MiB of it already in use); set train.block_storage=disk, or raise num_workers.")
