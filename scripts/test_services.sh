#!/usr/bin/env bash
# What the test suite needs beyond the venv, installed from Debian's packages when missing and when this
# runs as root:
# - OpenSSH's server, which tests/sftp.py starts on 127.0.0.1 as a remote filesystem for run directories
#   given as sftp:// URIs. The package's own service is kept from starting (policy-rc.d): the only sshd
#   the tests run is theirs, bound to loopback.
# - podman, runc and debootstrap, with which tests/test_docker_image.py builds a base image from Debian's
#   packages, builds the Dockerfile's image on it and runs the demo inside (no daemon to start).
# Without root or apt, the tests that need them skip, saying why.
set -uo pipefail
missing=()
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
command -v debootstrap >/dev/null || missing+=(debootstrap)
[ ${#missing[@]} = 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "test_services: ${missing[*]} missing and cannot be installed here (needs root and apt-get);" \
       "the sftp:// run-directory test and the container image test will skip" >&2
  exit 0
fi
policy=/usr/sbin/policy-rc.d
had_policy=0; [ -e "$policy" ] && had_policy=1
[ "$had_policy" = 1 ] || { printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; }
export DEBIAN_FRONTEND=noninteractive
{ apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
  || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${missing[@]}" >/dev/null 2>&1; }; } \
  || echo "test_services: apt-get install ${missing[*]} failed; the tests that need them will skip" >&2
[ "$had_policy" = 1 ] || rm -f "$policy"
exit 0
