"""Checkpoints through pyarrow filesystems (local path, file://, hdfs://, s3://, ...).

Layout under `checkpoint.dir`:

    step-000000120/manifest.json        step, epoch, history, optimizer/scheduler scalars (JSON)
    step-000000120/state.safetensors    model parameters, optimizer tensors, torch RNG state
    step-000000120/rank-00003.safetensors   per-rank state: error-feedback residual, epoch statistics
    step-000000120/zero-00001.safetensors   shard=optimizer: one slice of the optimizer state

How a checkpoint is written and committed (the manifest, last): `write`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import torch

MANIFEST = "manifest.json"
STATE = "state.safetensors"
_STEP_DIR = re.compile(r"^step-(\d{9})$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (corrupted, or from another model)."""


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    if "://" in uri:
        fs, path = pafs.FileSystem.from_uri(uri)
        return fs, path.rstrip("/")
    return pafs.LocalFileSystem(), str(Path(uri).resolve())


def _write(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    with fs.open_output_stream(path) as out:
        out.write(data)


def _read(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as src:
        return src.read()


def child(uri: str, name: str) -> str:
    """`uri`/`name`, keeping the scheme and any query (s3://bucket/ckpt?endpoint_override=...)."""
    if "://" not in uri:
        return str(Path(uri).resolve() / name)
    base, sep, query = uri.partition("?")
    return f"{base.rstrip('/')}/{name}{sep}{query}"


def step_dirs(uri: str) -> list[tuple[int, str]]:
    """(step, location) of every committed checkpoint, oldest first; a location is a URI when `uri` is one,
    so that whoever reads it next (an executor on another host) opens the same filesystem."""
    fs, root = filesystem(uri)
    if fs.get_file_info(root).type == pafs.FileType.NotFound:
        return []
    found = []
    for info in fs.get_file_info(pafs.FileSelector(root)):
        match = _STEP_DIR.match(info.base_name)
        committed = match and fs.get_file_info(f"{info.path}/{MANIFEST}").type == pafs.FileType.File
        if match and committed:
            found.append((int(match.group(1)), child(uri, info.base_name)))
    return sorted(found)


def latest(uri: str | None) -> str | None:
    if not uri:
        return None
    dirs = step_dirs(uri)
    return dirs[-1][1] if dirs else None


def _optimizer_split(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {"param_groups": state["param_groups"], "state": {}}
    for idx, entry in state["state"].items():
        scalars["state"][str(idx)] = {}
        for key, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"optimizer/{idx}/{key}"] = value.detach().cpu().contiguous()
            else:
                scalars["state"][str(idx)][key] = value
    return tensors, scalars


def _optimizer_join(tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {int(i): dict(v) for i, v in scalars["state"].items()}
    for key, value in tensors.items():
        if key.startswith("optimizer/"):
            _, idx, name = key.split("/", 2)
            state.setdefault(int(idx), {})[name] = value
    return {"state": state, "param_groups": scalars["param_groups"]}


@dataclass
class Snapshot:
    """Everything needed to continue training at `step` exactly as if it had not stopped."""

    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    rng: torch.Tensor
    history: list[dict[str, float]]
    rank_state: dict[str, torch.Tensor]
    zero: dict[str, int] | None = None
    """A sharded run's layout ({"num_params", "num_shards"}): its optimizer state is in `zero-K` files,
    one per shard, not in the state file. None: the optimizer state is whole in the state file."""
    balance: dict[str, Any] | None = None
    """`balance: speed`'s measured speeds, hosts and executors, its cut and which block each rank read, so a
    relaunch cuts the same blocks and gives each rank the same one; None: even."""


def write(
    uri: str, *, rank: int, step: int, barrier: Any, keep: int, model: torch.nn.Module,
    optimizer: dict[str, Any], scheduler: Any, history: list[dict[str, float]],
    rank_state: dict[str, torch.Tensor], zero: tuple[dict[str, int], int, dict[str, torch.Tensor]] | None = None,
    balance: dict[str, Any] | None = None,
) -> None:
    """Collective: every rank calls it at the same step. `barrier()` must block until all ranks arrive.

    Writing: rank 0 clears `step-N/`; after a barrier every rank writes its own
    file into it; after a second barrier rank 0 writes the state and then the
    manifest, last: the manifest is the commit point. Readers only trust `step-*`
    folders that hold a manifest, so a crash mid-write leaves nothing that looks
    valid, and no step relies on renaming a folder (object stores such as S3
    cannot move one). Rank 0 then prunes all but the newest `keep`. Tensors are
    stored with safetensors and metadata as JSON: loading a checkpoint never
    unpickles code.

    `optimizer` is rank 0's optimizer state_dict. `zero`, in a sharded run: (layout, this rank's shard index,
    its slice's optimizer tensors); each rank writes its slice to `zero-<index>.safetensors` beside its rank
    file, and the manifest, written last, commits them with the rest.
    """
    from safetensors.torch import save

    fs, root = filesystem(uri)
    tmp = f"{root}/step-{step:09d}"
    if rank == 0:
        if fs.get_file_info(tmp).type != pafs.FileType.NotFound:
            fs.delete_dir(tmp)  # a leftover of an attempt that died before its manifest
        fs.create_dir(tmp, recursive=True)
    barrier()
    _write(fs, f"{tmp}/rank-{rank:05d}.safetensors",
           save({k: v.detach().cpu().contiguous() for k, v in rank_state.items()}))
    if zero is not None:
        _write(fs, f"{tmp}/zero-{zero[1]:05d}.safetensors", save(zero[2]))
    barrier()
    if rank != 0:
        return
    opt_tensors, opt_scalars = _optimizer_split(optimizer)
    tensors = {f"model/{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tensors.update(opt_tensors)
    tensors["rng/torch"] = torch.get_rng_state()
    _write(fs, f"{tmp}/{STATE}", save(tensors))
    manifest = {"format": "blocksync-checkpoint/1", "step": step, "optimizer": opt_scalars,
                "scheduler": scheduler.state_dict(), "history": history,
                **({"zero": zero[0]} if zero is not None else {}),
                **({"balance": balance} if balance else {})}
    _write(fs, f"{tmp}/{MANIFEST}", json.dumps(manifest).encode())  # the commit point
    for step_done, _ in step_dirs(uri)[:-keep]:
        fs.delete_dir(f"{root}/step-{step_done:09d}")


def read(path: str, rank: int | None = None) -> Snapshot:
    """Load a committed checkpoint folder; `rank` also loads that rank's own state."""
    from safetensors.torch import load

    fs, folder = filesystem(path)
    try:
        manifest = json.loads(_read(fs, f"{folder}/{MANIFEST}"))
        tensors = load(_read(fs, f"{folder}/{STATE}"))
    except Exception as err:  # any read or parse failure makes the checkpoint unusable
        raise _unusable(path, err) from err
    rank_state = read_part(path, f"rank-{rank:05d}") if rank is not None else {}
    model = {k.removeprefix("model/"): v for k, v in tensors.items() if k.startswith("model/")}
    return Snapshot(
        step=int(manifest["step"]),
        model=model,
        optimizer=_optimizer_join(tensors, manifest["optimizer"]),
        scheduler=manifest["scheduler"],
        rng=tensors["rng/torch"],
        history=manifest["history"],
        rank_state=rank_state,
        zero=manifest.get("zero"),
        balance=manifest.get("balance"),
    )


def read_manifest(path: str) -> dict[str, Any]:
    """A committed checkpoint's manifest alone (step, history, balance), without its tensors."""
    fs, folder = filesystem(path)
    try:
        return json.loads(_read(fs, f"{folder}/{MANIFEST}"))
    except Exception as err:  # any read or parse failure makes the checkpoint unusable
        raise _unusable(path, err) from err


def read_part(path: str, name: str) -> dict[str, torch.Tensor]:
    """The tensors of one part of a committed checkpoint: `rank-<R>` (a rank's state) or `zero-<K>` (shard K
    of a sharded run's optimizer state)."""
    from safetensors.torch import load

    fs, folder = filesystem(path)
    try:
        return load(_read(fs, f"{folder}/{name}.safetensors"))
    except Exception as err:
        raise _unusable(path, err) from err


def _unusable(path: str, err: Exception) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {path} is corrupted or incomplete ({type(err).__name__}: {err}); "
        "delete it to resume from an older one, or start fresh with another checkpoint.dir."
    )


def check_shard_mode(snapshot: Snapshot, shard: str, path: str) -> None:
    """A checkpoint's optimizer state is whole or in shards; the resuming run must keep it the same way."""
    saved = "optimizer" if snapshot.zero is not None else "none"
    if saved != shard:
        raise CheckpointError(
            f"checkpoint {path} was written with shard={saved!r} and this run has shard={shard!r}: its optimizer "
            f"state is {'in shards' if snapshot.zero else 'whole'}; set shard={saved!r} to resume it, or point "
            "checkpoint.dir at an empty folder."
        )


def check_compatible(snapshot: Snapshot, model: torch.nn.Module, path: str) -> None:
    """The checkpoint's parameters must fit `model` exactly (names and shapes)."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in snapshot.model.items()}
    if expected != found:
        diff = sorted(set(expected.items()) ^ set(found.items()))[:4]
        raise CheckpointError(
            f"checkpoint {path} holds a model of a different shape (differences: {diff}); "
            "point checkpoint.dir at this model's checkpoints or an empty folder."
        )
