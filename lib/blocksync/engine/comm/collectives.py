"""One small collective interface with three backends, started inside barrier tasks.

Every backend offers the same operations on a flat float32 tensor:
`allreduce_sum`, `broadcast` from a root, `allgather` (every rank's tensor, in
rank order: what the top-k and int8 compression modes exchange, and the
replicas' digest check), `start_allreduce` (asynchronous, for the overlapped
buckets of `comm.buckets`), and `close`. Without `train.overlap` the training loop
fuses all gradients, each already divided by the step's global batch size, into
one buffer per step: one collective call whatever the number of parameters.

How each backend starts (bootstrap through barrier primitives only): `start_collective`.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

import numpy as np
import torch

from blocksync.engine.errors import CollectiveError

log = logging.getLogger(__name__)


class Coordinator(Protocol):
    """The subset of BarrierTaskContext the collectives use."""

    def partitionId(self) -> int: ...  # noqa: N802 (Spark's name)
    def allGather(self, message: str = "") -> list[str]: ...  # noqa: N802
    def getTaskInfos(self) -> list[Any]: ...  # noqa: N802


def task_hosts(ctx: Coordinator) -> list[str]:
    """Host of every task, indexed by partition id (TaskInfo.address is 'host:port')."""
    return [info.address.rsplit(":", 1)[0] for info in ctx.getTaskInfos()]


def local_address(address: str, peers: list[str]) -> str:
    """This task's IP address for talking to `peers`.

    Normally `address` itself, resolved. A task address may be a hostname that
    resolves to loopback on its own host (Debian maps the hostname to 127.0.1.1)
    while the peers reach it over the network; then the address is the one the
    kernel would send from towards the first peer that is not loopback (a UDP
    connect sends nothing).
    """
    ip = _resolve(address)
    if not ip.startswith("127."):
        return ip
    for peer in peers:
        peer_ip = _resolve(peer)
        if peer_ip.startswith("127."):
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((peer_ip, 9))
            return str(probe.getsockname()[0])
    return ip


def _resolve(name: str) -> str:
    try:
        return socket.gethostbyname(name)
    except OSError:
        return name


def interface_for(address: str, configured: str | None, peers: list[str] | None = None) -> str:
    """The NIC Gloo should use: configured, else the one holding the task's address (see `local_address`)."""
    if configured:
        return configured
    ip = local_address(address, peers or [])
    if ip.startswith("127."):
        return "lo"
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            return name
    raise CollectiveError(
        f"no network interface holds this task's address {address} ({ip}); "
        "set network_interface to the NIC the executors talk over."
    )


class PendingReduce:
    """An all-reduce in flight: `finished` asks without blocking, `wait()` returns the sum (once done,
    again the same tensor)."""

    def __init__(self, poll: Callable[[], bool], wait: Callable[[], torch.Tensor]) -> None:
        self._poll, self._wait = poll, wait
        self._result: torch.Tensor | None = None

    @property
    def finished(self) -> bool:
        return self._result is not None or self._poll()

    def wait(self) -> torch.Tensor:
        if self._result is None:
            self._result = self._wait()
        return self._result


class Collective(ABC):
    name: str = ""
    overlap_in_flight: int | None = None
    """How many overlapped bucket all-reduces may be in flight at once (None: any number)."""
    device_tensors: bool = False
    """Whether CUDA tensors can go to the collective as they are (Horovod built with NCCL);
    otherwise the worker stages them through host memory for Gloo."""
    rendezvous: tuple[str, int] | None = None
    """Where the start-up rendezvous listened (rank 0's task host, ephemeral port); it is
    closed once every rank has joined. None for the spark backend, which opens nothing."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank = rank
        self.size = size

    @abstractmethod
    def allreduce_sum(self, flat: torch.Tensor, fp16: bool = False) -> torch.Tensor:
        """Elementwise sum over ranks; every rank receives identical bits.

        `fp16`: the buffer travels as float16 and comes back as float32.
        The sum may be written into `flat` itself (torch_gloo and horovod
        reduce in place): pass a buffer you no longer need.
        """

    def start_allreduce(self, flat: torch.Tensor, fp16: bool = False, tag: str = "") -> PendingReduce:
        """`allreduce_sum` started without waiting; `tag` names it among those in flight together.
        This default runs it at once (a backend without asynchronous collectives)."""
        total = self.allreduce_sum(flat, fp16)
        return PendingReduce(lambda: True, lambda: total)

    @abstractmethod
    def allgather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's 1-D tensor (same length and dtype everywhere), concatenated in rank order."""

    @abstractmethod
    def broadcast(self, flat: torch.Tensor, root: int = 0) -> torch.Tensor:
        """`root`'s tensor on every rank."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release the backend; safe to call twice."""

    def gather_digests(self, digest: str) -> list[str]:
        """Every rank's full hex digest, through one all-gather of its bytes (as uint8)."""
        mine = torch.tensor(list(bytes.fromhex(digest)), dtype=torch.uint8)
        everyone = self.allgather(mine).reshape(self.size, -1)
        return [bytes(row.tolist()).hex() for row in everyone]

    def bytes_per_allreduce(self, num_bytes: int) -> float:
        """Bytes this rank sends for one all-reduce of `num_bytes` (ring: 2(N-1)/N * S)."""
        return 2.0 * (self.size - 1) / self.size * num_bytes

    native_reduce_scatter: bool = False
    """Whether `reduce_scatter_sum` sends only (N-1)/N * S (a real reduce-scatter), or is the fallback."""

    @property
    def shard_index(self) -> int:
        """Which 1/N slice `reduce_scatter_sum` returns to this rank, and where `allgather` puts its tensor:
        the backend's own rank order (Horovod's may differ from the partition id across hosts)."""
        return self.rank

    @property
    def shard_order(self) -> list[int]:
        """`shard_index` of every rank, indexed by partition id (the same on every rank)."""
        return list(range(self.size))

    def reduce_scatter_sum(self, flat: torch.Tensor) -> torch.Tensor:
        """Slice `shard_index` of the elementwise sum over ranks; `flat.numel()` must divide by N.

        The fallback, for backends without a reduce-scatter of their own: all-reduce the whole buffer,
        then keep one's slice. It saves the memory (only the slice outlives the call) but sends what an
        all-reduce sends, 2(N-1)/N * S, not (N-1)/N * S (`bytes_per_reduce_scatter`). `flat` may be
        overwritten.
        """
        n = flat.numel() // self.size
        return self.allreduce_sum(flat)[self.shard_index * n:(self.shard_index + 1) * n].clone()

    def allgather_in_place(self, flat: torch.Tensor) -> torch.Tensor:
        """`flat` holds N equal slices in shard order, slice `shard_index` this rank's own; afterwards every
        slice holds its owner's. This default gathers into a new tensor and copies (a transient copy of
        `flat`); the Gloo backends override it with one in-place broadcast per slice."""
        n = flat.numel() // self.size
        flat.copy_(self.allgather(flat[self.shard_index * n:(self.shard_index + 1) * n]))
        return flat

    def bytes_per_reduce_scatter(self, num_bytes: int) -> float:
        """Bytes this rank sends for one `reduce_scatter_sum` of `num_bytes`."""
        if self.native_reduce_scatter:
            return (self.size - 1) / self.size * num_bytes
        return self.bytes_per_allreduce(num_bytes)

    def bytes_per_allgather(self, num_bytes: int) -> float:
        """Bytes this rank sends for one `allgather` of its `num_bytes` (ring: (N-1) * s)."""
        return float((self.size - 1) * num_bytes)


def horovod_slots(hosts: list[str]) -> list[Any]:
    """Horovod's slot (rank, local rank, cross rank...) of every task, indexed by partition id."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    counts: dict[str, int] = {}
    for h in hosts:
        counts[h] = counts.get(h, 0) + 1
    plan = get_host_assignments(parse_hosts(",".join(f"{h}:{n}" for h, n in counts.items())), len(hosts))
    by_host = {(s.hostname, s.local_rank): s for s in plan}
    return [by_host[(h, hosts[:p].count(h))] for p, h in enumerate(hosts)]


class Rendezvous:
    """Rank 0's start-up server for `backend` (none for `spark`), open until the collective is up.

    `port` is set on rank 0 at once; the other ranks learn it from whatever
    allGather comes next (`share`), which is how the worker folds it into its
    block-facts allGather instead of paying a second one.
    """

    def __init__(self, backend: str, ctx: Coordinator, *, timeout_seconds: int) -> None:
        self.hosts = task_hosts(ctx)
        self.server: Any = None
        self.port: int | None = None
        if ctx.partitionId() != 0:
            return
        if backend == "horovod":
            import_horovod()
            from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

            # Horovod's own RendezvousServer binds every interface; we bind only the task's address.
            self.server = RendezvousHTTPServer((local_address(self.hosts[0], self.hosts), 0), RendezvousHandler, 0)
            self.server.init(horovod_slots(self.hosts))
            threading.Thread(target=self.server.serve_forever, name="hvd-rendezvous", daemon=True).start()
            self.port = int(self.server.server_address[1])
        elif backend == "torch_gloo":
            import torch.distributed as dist

            self.server = dist.TCPStore(local_address(self.hosts[0], self.hosts), 0, len(self.hosts), is_master=True,
                                        timeout=timedelta(seconds=timeout_seconds), wait_for_workers=False)
            self.port = int(self.server.port)

    def share(self, gathered_ports: list[int | None]) -> None:
        """Take rank 0's port from an allGather in which every rank sent its `port`."""
        self.port = gathered_ports[0]

    def close(self) -> None:
        """Stop listening; safe to call twice."""
        server, self.server = self.server, None
        if server is not None and hasattr(server, "shutdown"):  # the HTTP server; a TCPStore closes when dropped
            server.shutdown()
            server.server_close()


class SparkCollective(Collective):
    name = "spark"

    def __init__(self, ctx: Coordinator) -> None:
        hosts = task_hosts(ctx)
        super().__init__(ctx.partitionId(), len(hosts))
        self._ctx = ctx

    def _gather(self, flat: torch.Tensor) -> list[np.ndarray]:
        array = flat.detach().cpu().numpy()
        payload = base64.b64encode(array.tobytes()).decode("ascii")
        return [np.frombuffer(base64.b64decode(m), dtype=array.dtype) for m in self._ctx.allGather(payload)]

    def allreduce_sum(self, flat: torch.Tensor, fp16: bool = False) -> torch.Tensor:
        parts = self._gather(flat.half() if fp16 else flat)
        total = parts[0].astype(np.float32)
        for part in parts[1:]:  # fixed rank order: identical result on every rank
            total += part.astype(np.float32)
        return torch.from_numpy(total).to(flat.device)

    def allgather(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.concatenate(self._gather(tensor))).to(tensor.device)

    def broadcast(self, flat: torch.Tensor, root: int = 0) -> torch.Tensor:
        return torch.from_numpy(self._gather(flat)[root].copy()).to(flat.device)

    def bytes_per_allreduce(self, num_bytes: int) -> float:
        return num_bytes * 4.0 / 3.0  # base64 up to the driver


class TorchGlooCollective(Collective):
    name = "torch_gloo"

    def __init__(self, ctx: Coordinator, rendezvous: Rendezvous, *, timeout_seconds: int,
                 interface: str | None) -> None:
        import torch.distributed as dist

        hosts = rendezvous.hosts
        rank, size = ctx.partitionId(), len(hosts)
        super().__init__(rank, size)
        self._dist = dist
        if dist.is_initialized():  # a previous task in this reused Python worker
            dist.destroy_process_group()
        os.environ["GLOO_SOCKET_IFNAME"] = interface_for(hosts[rank], interface, hosts)
        timeout = timedelta(seconds=timeout_seconds)
        # Rank 0's store server is the rendezvous' own object, so it can be closed
        # once the group is up; every rank (rank 0 included) joins as a client.
        self.rendezvous = (hosts[0], int(rendezvous.port or 0))
        store = dist.TCPStore(hosts[0], int(rendezvous.port or 0), size, is_master=False, timeout=timeout)
        try:
            dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=timeout)
            # Gloo connects the full mesh inside init; after one collective every
            # rank is past the store, so its server can stop listening.
            dist.all_reduce(torch.zeros(1))
        except Exception as err:
            raise CollectiveError(f"torch.distributed gloo failed to start on rank {rank}: {err}") from err
        finally:
            rendezvous.close()
        self._store: Any = store  # the client: torch keeps a reference to it anyway
        self._group_started = True

    # No native reduce-scatter: torch's ProcessGroupGloo implements reduce_scatter_tensor as a clone and a
    # full all-reduce (its wire bytes measured equal to all_reduce's: 24 MiB of a 16 MiB buffer at N=4), so
    # the base class's fallback does the same without the clone.

    def allreduce_sum(self, flat: torch.Tensor, fp16: bool = False) -> torch.Tensor:
        buf = flat.half() if fp16 else flat
        self._dist.all_reduce(buf, op=self._dist.ReduceOp.SUM)
        return buf.float() if fp16 else buf

    def start_allreduce(self, flat: torch.Tensor, fp16: bool = False, tag: str = "") -> PendingReduce:
        buf = flat.half() if fp16 else flat
        work = self._dist.all_reduce(buf, op=self._dist.ReduceOp.SUM, async_op=True)

        def wait() -> torch.Tensor:
            work.wait()
            return buf.float() if fp16 else buf
        return PendingReduce(work.is_completed, wait)

    def allgather(self, tensor: torch.Tensor) -> torch.Tensor:
        # Into one output tensor: a list of parts and their concatenation would hold the result twice.
        out = torch.empty(self.size * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
        gather = getattr(self._dist, "all_gather_single", None) or self._dist.all_gather_into_tensor
        gather(out, tensor.contiguous().reshape(-1))
        return out

    def broadcast(self, flat: torch.Tensor, root: int = 0) -> torch.Tensor:
        self._dist.broadcast(flat, src=root)
        return flat

    def allgather_in_place(self, flat: torch.Tensor) -> torch.Tensor:
        # torch's Gloo all_gather_into_tensor gathers into a flat buffer of its own and copies out (a whole
        # transient copy); a broadcast writes into the tensor it is given. Gloo's binomial tree sends (N-1) x
        # slice per broadcast in all, and with the roots rotating each rank sends that much over the N.
        n = flat.numel() // self.size
        works = [self._dist.broadcast(flat[i * n:(i + 1) * n], src=i, async_op=True) for i in range(self.size)]
        for work in works:
            work.wait()
        return flat

    def close(self) -> None:
        if self._group_started and self._dist.is_initialized():
            self._dist.destroy_process_group()
        self._group_started = False
        self._store = None


HOROVOD_DEFAULT_FUSION_MB = 128.0
POLL_SECONDS = 100e-6


def _set_fusion_threshold(megabytes: float) -> None:
    """HOROVOD_FUSION_THRESHOLD for the coming hvd.init (unset means Horovod's default, 128 MiB).

    Horovod 0.28.1 segfaults in a later hvd.init in a process whose first init
    had a custom threshold, so the launcher allows a non-default value only
    with spark.python.worker.reuse=false.
    """
    os.environ.pop("HOROVOD_FUSION_THRESHOLD", None)
    if megabytes != HOROVOD_DEFAULT_FUSION_MB:
        os.environ["HOROVOD_FUSION_THRESHOLD"] = str(int(megabytes * 1024 * 1024))


def import_horovod() -> Any:
    """horovod.torch, or a CollectiveError that says how to get a working build."""
    try:
        import horovod.torch as hvd
    except Exception as err:  # ImportError, or Horovod's own error when built against another torch
        raise CollectiveError(
            f"backend 'horovod' needs Horovod 0.28.1 built with PyTorch and Gloo, and it does not import: {err}. "
            "Run scripts/setup_env.sh (make setup) to build it, or choose backend=torch_gloo explicitly."
        ) from err
    if not hvd.gloo_built():
        raise CollectiveError("the installed Horovod was built without Gloo; rebuild it with scripts/setup_env.sh.")
    return hvd


class HorovodCollective(Collective):
    name = "horovod"
    # Horovod fuses tensors that are ready in the same cycle into one buffer: with two buckets in
    # flight, where a ring's chunk boundaries fall (so the summation order) would depend on timing.
    overlap_in_flight = 1

    def __init__(
        self, ctx: Coordinator, rendezvous: Rendezvous, *, timeout_seconds: int, interface: str | None,
        fusion_threshold_mb: float = 128.0, cycle_time_ms: float = 1.0, reduce_op: str = "sum",
    ) -> None:
        hvd = import_horovod()
        if reduce_op == "adasum" and not hvd.mpi_built():
            raise CollectiveError(
                "horovod.reduce_op=adasum needs Horovod's MPI (CPU) or NCCL (GPU) Adasum kernels; this build has "
                "Gloo only. Use reduce_op=sum, or build Horovod with MPI."
            )
        hosts = rendezvous.hosts
        rank, size = ctx.partitionId(), len(hosts)
        my_host = hosts[rank]
        slots = horovod_slots(hosts)
        slot = slots[rank]
        port = int(rendezvous.port or 0)
        os.environ.update(
            HOROVOD_GLOO_RENDEZVOUS_ADDR=hosts[0],
            HOROVOD_GLOO_RENDEZVOUS_PORT=str(port),
            HOROVOD_CONTROLLER="gloo",
            HOROVOD_CPU_OPERATIONS="gloo",
            HOROVOD_GLOO_IFACE=interface_for(my_host, interface, hosts),
            HOROVOD_GLOO_TIMEOUT_SECONDS=str(timeout_seconds),
            HOROVOD_CYCLE_TIME=str(cycle_time_ms),
            HOROVOD_HOSTNAME=my_host,
            HOROVOD_RANK=str(slot.rank),
            HOROVOD_SIZE=str(slot.size),
            HOROVOD_LOCAL_RANK=str(slot.local_rank),
            HOROVOD_LOCAL_SIZE=str(slot.local_size),
            HOROVOD_CROSS_RANK=str(slot.cross_rank),
            HOROVOD_CROSS_SIZE=str(slot.cross_size),
        )
        _set_fusion_threshold(fusion_threshold_mb)
        try:
            hvd.init()
            # Once one all-reduce has completed, every rank is past the rendezvous. A rank whose
            # init failed raises instead, the barrier stage fails, and Spark stops the others.
            hvd.allreduce(torch.zeros(1), name="blocksync.started")
        except Exception as err:
            raise CollectiveError(f"hvd.init() failed on rank {rank} ({my_host}): {err}") from err
        finally:
            rendezvous.close()
        if hvd.size() != size:
            raise CollectiveError(f"Horovod started with size {hvd.size()} but the barrier stage has {size} tasks")
        super().__init__(rank, size)
        self.rendezvous = (hosts[0], port)
        self._hvd = hvd
        self.device_tensors = bool(hvd.nccl_built())
        self._op = hvd.Adasum if reduce_op == "adasum" else hvd.Sum
        # Partition id -> Horovod rank, so `broadcast(root=partition)` means the same on every backend.
        self._hvd_rank = {p: s.rank for p, s in enumerate(slots)}
        self._open = True

    def allreduce_sum(self, flat: torch.Tensor, fp16: bool = False) -> torch.Tensor:
        buf = flat.half() if fp16 else flat  # what Horovod's Compression.fp16 does, without its copy
        # In place: hvd.allreduce allocates a fresh output per call, and at 16 MB its page faults
        # cost as much as the reduction. One name per buffer shape: Horovod caches responses by name.
        name = f"blocksync.sum.{flat.numel()}.{flat.dtype}.{int(fp16)}"
        self._wait(self._hvd.allreduce_async_(buf, op=self._op, name=name))
        return buf.float() if fp16 else buf

    def start_allreduce(self, flat: torch.Tensor, fp16: bool = False, tag: str = "") -> PendingReduce:
        buf = flat.half() if fp16 else flat
        handle = self._hvd.allreduce_async_(buf, op=self._op, name=f"blocksync.{tag}.{flat.numel()}.{int(fp16)}")

        def wait() -> torch.Tensor:
            self._wait(handle)
            return buf.float() if fp16 else buf
        return PendingReduce(lambda: bool(self._hvd.poll(handle)), wait)

    def allgather(self, tensor: torch.Tensor) -> torch.Tensor:
        name = f"blocksync.gather.{tensor.numel()}.{tensor.dtype}"
        return self._wait(self._hvd.allgather_async(tensor.contiguous(), name=name))

    native_reduce_scatter = True  # Gloo's ReduceScatterHalvingDoubling: (N-1)/N * S measured on the wire

    @property
    def shard_index(self) -> int:
        return self._hvd_rank[self.rank]

    @property
    def shard_order(self) -> list[int]:
        return [self._hvd_rank[p] for p in range(self.size)]

    def reduce_scatter_sum(self, flat: torch.Tensor) -> torch.Tensor:
        # Horovod splits the first dimension evenly (the caller pads to a multiple of N) and hands
        # slice i to Horovod rank i; it sums in its own order, so the bits may differ from allreduce_sum's.
        name = f"blocksync.scatter.{flat.numel()}.{flat.dtype}"
        return self._wait(self._hvd.reducescatter_async(flat, op=self._hvd.Sum, name=name))

    def broadcast(self, flat: torch.Tensor, root: int = 0) -> torch.Tensor:
        return self._wait(self._hvd.broadcast_async_(flat, root_rank=self._hvd_rank[root], name="blocksync.bcast"))

    def allgather_in_place(self, flat: torch.Tensor) -> torch.Tensor:
        # hvd.allgather allocates its output (a whole transient copy); an in-place broadcast of each slice
        # from its owner (Horovod rank i owns slice i) writes into `flat` itself, and Horovod does not fuse
        # broadcasts. Gloo's binomial tree: (N-1) x slice sent per rank over the N broadcasts, as a ring's.
        n = flat.numel() // self.size
        handles = [self._hvd.broadcast_async_(flat[i * n:(i + 1) * n], root_rank=i, name=f"blocksync.gather.{i}.{n}")
                   for i in range(self.size)]
        for handle in handles:
            self._wait(handle)
        return flat

    def _wait(self, handle: int) -> torch.Tensor:
        """Horovod's result, waiting by short sleeps.

        `hvd.synchronize` spins on `std::this_thread::yield()` until the op is
        done, so each waiting rank keeps a core busy. With more ranks than cores
        (4 workers on 2 cores) the spinning ranks starve the background threads
        that do the work: a 4 KB all-reduce took 11-14 ms instead of torch
        gloo's 4-5 ms (benchmarks/README.md, "Horovod against torch_gloo"). Sleeping
        100 us between polls adds at most that much latency.
        """
        while not self._hvd.poll(handle):
            time.sleep(POLL_SECONDS)
        return self._hvd.synchronize(handle)

    def close(self) -> None:
        if self._open:
            self._hvd.shutdown()
            self._open = False


def to_collective(coll: Collective, tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` where `coll` can reduce it: unchanged on CPU or with NCCL, else copied to host memory."""
    if tensor.device.type == "cuda" and not coll.device_tensors:
        return tensor.cpu()
    return tensor


def start_collective(
    backend: str, ctx: Coordinator, *, timeout_seconds: int, interface: str | None, horovod: Any = None,
    rendezvous: Rendezvous | None = None,
) -> Collective:
    """Start `backend` in this barrier task; `horovod` carries HorovodSettings (tuning knobs).

    `rendezvous`: one opened beforehand whose port every rank already knows;
    without it, one is opened here and its port shared by one allGather.

    Bootstrap uses only barrier primitives (`BarrierTaskContext.allGather`), and
    as few of them as possible: Spark answers an allGather on a once-a-second poll,
    so each costs about a second. `Rendezvous` opens rank 0's start-up server
    before the worker's own allGather of its block facts, so the port rides along
    with them (`start_collective` gathers it itself when called without one):

    - `horovod`: rank 0 starts Horovod's Gloo rendezvous HTTP server (bound to its
      own task address, ephemeral port) with the slot plan every rank computes
      from the task hosts; every task sets the HOROVOD_* variables of its slot and
      calls `hvd.init()`. After one Horovod all-reduce every rank is past the
      rendezvous, and the server is stopped (it is only needed for start-up).
    - `torch_gloo`: rank 0 opens a `TCPStore` server on its task address (ephemeral
      port); every task joins `init_process_group("gloo")` as a store client, and
      the server is closed after the first collective (Gloo's mesh is connected by
      then; nothing later uses the store).
    - `spark`: `allGather` of each rank's base64-encoded buffer, summed in rank
      order. No extra dependency; every byte goes through the driver, so it is
      only for tiny models.

    A backend that cannot start raises `CollectiveError` with the reason; nothing
    falls back to another backend.
    """
    if rendezvous is None and backend != "spark":
        rendezvous = Rendezvous(backend, ctx, timeout_seconds=timeout_seconds)
        rendezvous.share([json.loads(m) for m in ctx.allGather(json.dumps(rendezvous.port))])
    if backend == "horovod":
        knobs = {} if horovod is None else {
            "fusion_threshold_mb": horovod.fusion_threshold_mb,
            "cycle_time_ms": horovod.cycle_time_ms,
            "reduce_op": horovod.reduce_op,
        }
        assert rendezvous is not None
        return HorovodCollective(ctx, rendezvous, timeout_seconds=timeout_seconds, interface=interface, **knobs)
    if backend == "torch_gloo":
        assert rendezvous is not None
        return TorchGlooCollective(ctx, rendezvous, timeout_seconds=timeout_seconds, interface=interface)
    if backend == "spark":
        return SparkCollective(ctx)
    raise CollectiveError(f"unknown backend {backend!r}")
