#!/usr/bin/env bash
# What the test suite needs beyond the venv, installed from Debian's packages when missing and when this
# runs as root: OpenSSH's server, which tests/sftp.py starts on 127.0.0.1 as a remote filesystem for run
# directories given as sftp:// URIs. The package's own service is kept from starting (policy-rc.d): the only
# sshd the tests run is theirs, bound to loopback. Without root or apt, the tests that need it skip, saying why.
set -uo pipefail
[ -x /usr/sbin/sshd ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "test_services: /usr/sbin/sshd missing and cannot install openssh-server here (needs root and apt-get);" \
       "the sftp:// run-directory test will skip" >&2
  exit 0
fi
policy=/usr/sbin/policy-rc.d
had_policy=0; [ -e "$policy" ] && had_policy=1
[ "$had_policy" = 1 ] || { printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; }
export DEBIAN_FRONTEND=noninteractive
{ apt-get install -y -q openssh-server >/dev/null 2>&1 \
  || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q openssh-server >/dev/null 2>&1; }; } \
  || echo "test_services: apt-get install openssh-server failed; the sftp:// run-directory test will skip" >&2
[ "$had_policy" = 1 ] || rm -f "$policy"
exit 0
