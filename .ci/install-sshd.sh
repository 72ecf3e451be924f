#!/usr/bin/env bash
# Install what the `multihost` test tier needs (tests/multihost: network namespaces as hosts,
# each running its own sshd), for .ci/run or a developer machine:
#   - sshd: Debian's openssh-server, if /usr/sbin/sshd is missing (the fixture starts its own
#     daemons on a non-default port, with per-test keys; the system service is not used);
#   - ip (iproute2) for `ip netns`, if missing.
# The tier also needs root (network namespaces); without it the tests skip, or fail under
# HVD_REQUIRE=multihost (as .ci/run sets it).
set -euo pipefail
log() { printf '[install-sshd] %s\n' "$*" >&2; }

need=()
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    log "missing ${need[*]} and no apt-get: install them with the system's package manager"
    exit 1
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
log "installing ${need[*]} (apt-get)"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${need[@]}" >/dev/null
# The package enables its own service; the tests never use it (their daemons are their own).
