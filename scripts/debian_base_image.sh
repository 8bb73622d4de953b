#!/usr/bin/env bash
# A Debian bookworm base image with Python 3.11, built from Debian's packages alone, for machines that
# reach a Debian mirror but no container registry (python:3.11-slim-bookworm cannot be pulled there).
#
#   sudo bash scripts/debian_base_image.sh [TAG]        # default TAG: localhost/blocksync-base:bookworm
#   podman build --build-arg CPU_IMAGE=localhost/blocksync-base:bookworm -t blocksync .
#
# debootstrap lays a minimal root (needs root), apt-get adds python3.11, its venv and headers (the
# Dockerfile's builder compiles Horovod against them), and `podman import` (or `docker import`) turns the
# folder into an image. The host's extra CA certificates (/usr/local/share/ca-certificates, e.g. a
# proxy's) are copied in, so the image reaches the package indexes the way the host does.
# Knobs: DEBIAN_MIRROR (default http://deb.debian.org/debian), CONTAINER_ENGINE (podman, else docker).
set -euo pipefail
tag=${1:-localhost/blocksync-base:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
engine=${CONTAINER_ENGINE:-$(command -v podman || command -v docker || true)}

say() { printf '[base-image] %s\n' "$*" >&2; }
die() { printf '[base-image] ERROR: %s\n' "$*" >&2; exit 2; }

[ "$(id -u)" = 0 ] || die "debootstrap needs root; run it with sudo."
command -v debootstrap >/dev/null || die "debootstrap not found; install it (Debian: apt-get install debootstrap)."
[ -n "$engine" ] || die "no container engine; install podman (Debian: apt-get install podman) or docker."

work=$(mktemp -d /var/tmp/blocksync-base.XXXXXX)
root="$work/rootfs"
cleanup() {
  for m in proc dev/pts dev; do umount "$root/$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

say "debootstrap bookworm from $mirror into $root (about 2 minutes)"
debootstrap --variant=minbase --include=ca-certificates bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -20 "$work/debootstrap.log" >&2; die "debootstrap failed (log above)."; }

if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
fi
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
say "installing python3.11, python3.11-venv and python3.11-dev"
chroot "$root" /bin/sh -c 'update-ca-certificates >/dev/null && apt-get update -qq \
  && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
       python3.11 python3.11-venv python3.11-dev >/dev/null \
  && apt-get clean && rm -rf /var/lib/apt/lists/*' || die "installing Python 3.11 in the root failed."
umount "$root/dev" "$root/proc"

say "importing the root as $tag with $engine"
tar -C "$root" -c . | "$engine" import --change 'CMD ["/bin/bash"]' - "$tag" >/dev/null
say "done: $tag"
