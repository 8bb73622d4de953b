"""The container image: build it from the repository's Dockerfile and run its demo (the image's CMD).

Skipped, with the reason, where no container engine can build here: no docker CLI, no
reachable daemon, no BuildKit (the Dockerfile picks its base stage with
`FROM base-${BASE}`; the classic builder would also build the CUDA stages and pull
nvidia/cuda), or no base image (no registry to pull python:3.11-slim-bookworm from).

Knobs (environment):
  BLOCKSYNC_DOCKER            the docker CLI to use (default: `docker` on PATH)
  DOCKER_HOST                 the daemon, as docker itself reads it
  BLOCKSYNC_DOCKER_CPU_IMAGE  a local base image passed as --build-arg CPU_IMAGE=...,
                              e.g. one made with debootstrap where no registry is reachable

The build takes minutes (a Horovod compile when the base image carries no cached wheel);
the demo about a minute.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TAG = "blocksync:pytest"
DEFAULT_CPU_IMAGE = "python:3.11-slim-bookworm"
# Never sent to the daemon: the repository has no .dockerignore, and `COPY . /app` would
# otherwise copy a 2 GB .venv whose interpreter links point outside the image.
FALLBACK_IGNORE = (".git", ".venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache",
                   "runs", "out", "spark-warehouse", "metastore_db", "mlruns", "*.egg-info")


def _docker() -> str | None:
    return os.environ.get("BLOCKSYNC_DOCKER") or shutil.which("docker")


def _run(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, DOCKER_BUILDKIT="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, **kwargs)


def _first_line(proc: subprocess.CompletedProcess) -> str:
    text = (proc.stderr or proc.stdout or "").strip()
    return text.splitlines()[0] if text else f"exit status {proc.returncode}"


def _engine_or_skip() -> tuple[str, str]:
    """The docker CLI and the base image to build on, or a skip that names what is missing."""
    docker = _docker()
    if docker is None:
        pytest.skip("no container engine: no docker CLI on PATH (set BLOCKSYNC_DOCKER)")
    server = _run([docker, "version", "--format", "{{.Server.Version}}"], timeout=60)
    if server.returncode != 0:
        pytest.skip(f"no container engine: the docker daemon is not reachable: {_first_line(server)}")
    probe = _run([docker, "build", "-q", "-"], timeout=120, input="FROM scratch\nLABEL blocksync-probe=1\n")
    if probe.returncode != 0:
        pytest.skip(f"no BuildKit (the Dockerfile's `FROM base-${{BASE}}` needs it): {_first_line(probe)}")
    base = os.environ.get("BLOCKSYNC_DOCKER_CPU_IMAGE") or DEFAULT_CPU_IMAGE
    if _run([docker, "image", "inspect", base], timeout=60).returncode != 0:
        pull = _run([docker, "pull", base], timeout=600)
        if pull.returncode != 0:
            pytest.skip(f"no base image {base}: not present and `docker pull` failed: {_first_line(pull)}"
                        " (set BLOCKSYNC_DOCKER_CPU_IMAGE to a local Debian bookworm image with python3.11)")
    return docker, base


def _clean_context(dest: Path) -> Path:
    """The files git would commit (tracked and untracked, not ignored), as the build context."""
    ctx = dest / "context"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout:
        for name in filter(None, listed.stdout.split("\0")):
            src = REPO / name
            if not src.exists() and not src.is_symlink():
                continue  # deleted in the work tree, still in the index
            target = ctx / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target, follow_symlinks=False)
    else:
        shutil.copytree(REPO, ctx, symlinks=True, ignore=shutil.ignore_patterns(*FALLBACK_IGNORE))
    return ctx


def _build_network(docker: str) -> list[str]:
    """Host networking for RUN steps where the daemon has no default bridge (dockerd --bridge=none)."""
    bridge = _run([docker, "network", "inspect", "bridge"], timeout=60)
    return [] if bridge.returncode == 0 else ["--network", "host"]


@pytest.mark.timeout(5400)
def test_image_builds_and_runs_the_demo(tmp_path):
    docker, base = _engine_or_skip()
    ctx = _clean_context(tmp_path)
    build = _run([docker, "build", "--progress=plain", *_build_network(docker),
                  "--build-arg", f"CPU_IMAGE={base}", "-t", TAG, str(ctx)], timeout=5000)
    assert build.returncode == 0, f"docker build failed:\n{(build.stdout + build.stderr)[-6000:]}"

    # The image's CMD is the demo: `blocksync run --config conf/local.yaml --overwrite --quiet`.
    demo = _run([docker, "run", "--rm", "--network", "none", TAG], timeout=1500)
    out = demo.stdout + demo.stderr
    assert demo.returncode == 0, f"the demo failed in the container:\n{out[-6000:]}"
    found = re.search(r"^test accuracy (\d\.\d{4}), F1 (\d\.\d{4}), log loss (\d+\.\d{4})$", out, re.M)
    assert found, f"no test accuracy line in the demo's output:\n{out[-3000:]}"
    assert float(found.group(1)) >= 0.9, found.group(0)  # the README's digits demo reaches 0.97
    assert re.search(r"^report: runs/local/report\.png\s+metrics: runs/local/metrics\.json$", out, re.M)
