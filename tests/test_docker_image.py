"""The container image: build it from the repository's Dockerfile and run its demo (the image's CMD).

The engine is `BLOCKSYNC_DOCKER` if set, else docker where its daemon answers, else podman
(daemonless: what CI uses here). The base image is `BLOCKSYNC_DOCKER_CPU_IMAGE` if set, else
python:3.11-slim-bookworm where it can be had, else one that `scripts/debian_base_image.sh` builds
from Debian's packages (root and debootstrap needed; about 2 minutes, kept for later runs).
Podman runs with `tests/containers/sandbox.conf` (why each line: the file) unless CONTAINERS_CONF
is set. With podman the build mounts the host's pip find-links folders (a local torch CPU wheel),
pip cache and Horovod wheel cache, so a rebuild on the same machine compiles nothing; the first
build compiles Horovod inside the image. The dependency stages are kept, tagged `localhost/blocksync-cache:*`
(about 7 GB: the builder's venv and the runtime's copy of it), so a later run after a source change
reuses them and only copies the sources (`podman rmi` them to reclaim the space).

Skipped, naming what is missing, where no engine, base image or container start is possible.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TAG = "localhost/blocksync:pytest"
CACHE_TAGS = ("localhost/blocksync-cache:builder", "localhost/blocksync-cache:runtime-base",
              "localhost/blocksync-cache:runtime-deps")
DEFAULT_CPU_IMAGE = "python:3.11-slim-bookworm"
DEBIAN_BASE = "localhost/blocksync-base:bookworm"
SANDBOX_CONF = REPO / "tests" / "containers" / "sandbox.conf"
WHEEL_CACHE = Path(os.environ.get("BLOCKSYNC_WHEEL_CACHE", Path.home() / ".cache" / "blocksync" / "wheels"))
PIP_CACHE = Path.home() / ".cache" / "pip"


def _env() -> dict[str, str]:
    env = dict(os.environ, DOCKER_BUILDKIT="1")
    env.setdefault("CONTAINERS_CONF", str(SANDBOX_CONF))
    return env


def _run(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(), **kwargs)


def _first_line(proc: subprocess.CompletedProcess) -> str:
    text = (proc.stderr or proc.stdout or "").strip()
    return text.splitlines()[-1] if text else f"exit status {proc.returncode}"


def _engine_or_skip() -> str:
    chosen = os.environ.get("BLOCKSYNC_DOCKER")
    if chosen:
        return chosen
    docker = shutil.which("docker")
    if docker and _run([docker, "version", "--format", "{{.Server.Version}}"], timeout=60).returncode == 0:
        return docker
    podman = shutil.which("podman")
    if podman is None:
        pytest.skip("no container engine: no docker daemon answers and podman is not installed "
                    "(Debian: apt-get install podman runc; scripts/test_services.sh does so as root)")
    return podman


def _base_or_skip(engine: str) -> str:
    chosen = os.environ.get("BLOCKSYNC_DOCKER_CPU_IMAGE")
    for image in ([chosen] if chosen else [DEFAULT_CPU_IMAGE, DEBIAN_BASE]):
        if _run([engine, "image", "inspect", image], timeout=60).returncode == 0:
            return image
    if chosen:
        pytest.skip(f"BLOCKSYNC_DOCKER_CPU_IMAGE={chosen} is not an image {engine} has")
    if _run([engine, "pull", DEFAULT_CPU_IMAGE], timeout=600).returncode == 0:
        return DEFAULT_CPU_IMAGE
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        pytest.skip(f"no base image: {DEFAULT_CPU_IMAGE} cannot be pulled, and building {DEBIAN_BASE} "
                    "from Debian's packages needs root and debootstrap")
    made = _run(["bash", str(REPO / "scripts" / "debian_base_image.sh"), DEBIAN_BASE], timeout=1200,
                cwd=REPO)
    assert made.returncode == 0, f"scripts/debian_base_image.sh failed:\n{made.stderr[-3000:]}"
    return DEBIAN_BASE


def _clean_context(dest: Path) -> Path:
    """The files git would commit (tracked and untracked, not ignored), as the build context."""
    ctx = dest / "context"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True, check=True)
    for name in filter(None, listed.stdout.split("\0")):
        src = REPO / name
        if src.exists() or src.is_symlink():  # else deleted in the work tree, still in the index
            (ctx / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, ctx / name, follow_symlinks=False)
    return ctx


def _podman_build_mounts() -> list[str]:
    """Build-time volumes: the host's pip find-links folders, pip cache and Horovod wheel cache."""
    args: list[str] = []
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    found = subprocess.run(["pip", "config", "get", "global.find-links"], capture_output=True, text=True)
    links += found.stdout.split() if found.returncode == 0 else []
    folders = [p for p in dict.fromkeys(links) if Path(p).is_dir()]
    for i, folder in enumerate(folders):
        args += ["-v", f"{folder}:/opt/find-links-{i}:ro"]
    if folders:
        args += ["--build-arg", "PIP_FIND_LINKS=" + " ".join(f"/opt/find-links-{i}" for i in range(len(folders)))]
    for host, inside in ((PIP_CACHE, "/root/.cache/pip"), (WHEEL_CACHE, "/opt/wheels")):
        host.mkdir(parents=True, exist_ok=True)
        args += ["-v", f"{host}:{inside}"]
    return args


@pytest.mark.timeout(5400)
def test_image_builds_and_runs_the_demo(tmp_path):
    engine = _engine_or_skip()
    base = _base_or_skip(engine)
    probe = _run([engine, "run", "--rm", base, "true"], timeout=300)
    if probe.returncode != 0:
        pytest.skip(f"{engine} cannot start a container here: {_first_line(probe)}")
    ctx = _clean_context(tmp_path)
    mounts = _podman_build_mounts() if Path(engine).name == "podman" else []
    try:
        # The three dependency stages first, each tagged, so the prune below keeps them as the build cache
        # (a rebuild after a source change then installs and copies nothing but the sources); then the image.
        for target, tag in (("builder", CACHE_TAGS[0]), ("runtime-base", CACHE_TAGS[1]),
                            ("runtime-deps", CACHE_TAGS[2]), (None, TAG)):
            chosen = ["--target", target] if target else []
            build = _run([engine, "build", *mounts, *chosen, "--build-arg", f"CPU_IMAGE={base}", "-t", tag,
                          str(ctx)], timeout=5000)
            assert build.returncode == 0, f"{engine} build failed:\n{(build.stdout + build.stderr)[-6000:]}"
        # The image's CMD is the demo: `blocksync run --config conf/local.yaml --overwrite --quiet`.
        demo = _run([engine, "run", "--rm", TAG], timeout=1500)
    finally:
        # Each build leaves a 3 GB image: remove it and the untagged layers; the tagged stages stay as the cache.
        _run([engine, "rmi", "-f", TAG], timeout=300)
        _run([engine, "image", "prune", "-f"], timeout=300)
    out = demo.stdout + demo.stderr
    assert demo.returncode == 0, f"the demo failed in the container:\n{out[-6000:]}"
    found = re.search(r"^test accuracy (\d\.\d{4}), F1 (\d\.\d{4}), log loss (\d+\.\d{4})$", out, re.M)
    assert found, f"no test accuracy line in the demo's output:\n{out[-3000:]}"
    assert float(found.group(1)) >= 0.9, found.group(0)  # the README's digits demo reaches 0.985
    # The paths are printed as the CLI resolves them inside the container (WORKDIR /app).
    assert re.search(r"^report: (/app/)?runs/local/report\.png\s+metrics: (/app/)?runs/local/metrics\.json$", out, re.M)
