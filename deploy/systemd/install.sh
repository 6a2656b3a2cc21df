#!/bin/sh
# Install roofwatch as a systemd service on a GPU node. Safe to re-run (upgrades in place).
#
#   sudo deploy/systemd/install.sh [SOURCE]
#
# It installs what you have, never a name looked up in an index unless you give one:
#   no SOURCE   the one roofwatch-*.whl lying beside this script (a release's wheel copied here),
#               else the checkout or unpacked release (sdist) this script sits in (../.. of it);
#               anything else is an error that says what to pass
#   SOURCE      a checkout or unpacked release directory, a wheel or sdist file, or a pip
#               requirement you name explicitly (e.g. "roofwatch==0.1.0" from your own index)
# The [amd] extra is added when /dev/kfd exists. docs/deploy.md has the install and upgrade steps.
#
# Environment (all optional):
#   ROOFWATCH_INSTALL_ROOT=/        install under another root (packaging, tests)
#   ROOFWATCH_NO_SYSTEMCTL=1        only lay out files: no groups, no systemctl, no health check
#   ROOFWATCH_PYTHON=python3        interpreter the virtualenv is created from
#   ROOFWATCH_PIP_ARGS=             extra pip arguments (e.g. "--no-deps --no-index")
#   ROOFWATCH_EXTRAS=               pip extras; default "amd" when /dev/kfd exists
#   ROOFWATCH_PROCESS_ATTRIBUTION=1 also install the process-attribution.conf drop-in
#   ROOFWATCH_HEALTH_TIMEOUT_S=60   how long to wait for /healthz
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=${ROOFWATCH_INSTALL_ROOT:-/}
root=${root%/}                       # "/" -> "", "/tmp/x/" -> "/tmp/x"
venv=$root/opt/roofwatch
unit_dir=$root/etc/systemd/system

fail() { echo "roofwatch: $*" >&2; exit 1; }

# The version a tree declares (agent/__init__.py, the one place it is written) or a wheel's file
# name carries; empty when SOURCE is a requirement or an sdist, whose version pip decides.
version_of() {
    if [ -d "$1" ]; then
        sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$1/agent/__init__.py" 2>/dev/null | head -n 1
    else
        case $(basename "$1") in
            roofwatch-*.whl) basename "$1" | cut -d- -f2 ;;
        esac
    fi
}

if [ $# -gt 0 ]; then
    source=$1
else
    tree=$(cd "$here/../.." && pwd)
    set -- "$here"/roofwatch-*.whl
    if [ $# -gt 1 ]; then
        fail "several wheels beside $here ($*): name the one to install: $0 WHEEL"
    elif [ -f "$1" ]; then
        source=$1
    elif [ -f "$tree/pyproject.toml" ] && grep -q '^name = "roofwatch"$' "$tree/pyproject.toml"; then
        source=$tree
    else
        fail "nothing to install: $here is not inside a roofwatch checkout or unpacked release, and no roofwatch wheel lies beside it; pass a directory, a wheel, an sdist or a requirement: $0 SOURCE"
    fi
fi
case $source in
    /*|./*|../*|.|..|*.whl|*.tar.gz|*.zip) [ -e "$source" ] || fail "$source does not exist" ;;
esac
expected=$(version_of "$source")
target=$source
if [ -z "${ROOFWATCH_EXTRAS+set}" ]; then
    ROOFWATCH_EXTRAS=
    if [ -e /dev/kfd ]; then ROOFWATCH_EXTRAS=amd; fi
fi
if [ -n "$ROOFWATCH_EXTRAS" ]; then target="${source}[$ROOFWATCH_EXTRAS]"; fi

echo "roofwatch: installing ${expected:+roofwatch $expected from }$source"
echo "roofwatch: virtualenv $venv"
[ -x "$venv/bin/python" ] || "${ROOFWATCH_PYTHON:-python3}" -m venv "$venv"
# shellcheck disable=SC2086  # ROOFWATCH_PIP_ARGS is a list of arguments
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade \
    ${ROOFWATCH_PIP_ARGS:-} "$target"
[ -x "$venv/bin/roofwatch" ] || fail "$venv/bin/roofwatch missing after pip install"
# What pip installed, from its own record (the agent's dependencies need not import for this).
installed=$("$venv/bin/python" -c 'from importlib.metadata import version; print(version("roofwatch"))') ||
    fail "no roofwatch in $venv after pip install"
if [ -n "$expected" ] && [ "$installed" != "$expected" ]; then
    fail "$source is roofwatch $expected, but $venv now holds roofwatch $installed"
fi
echo "roofwatch: roofwatch $installed in $venv"

echo "roofwatch: unit $unit_dir/roofwatch.service"
install -d -m 0755 "$unit_dir" "$root/etc/default"
install -m 0644 "$here/roofwatch.service" "$unit_dir/roofwatch.service"
if [ "${ROOFWATCH_PROCESS_ATTRIBUTION:-0}" = 1 ]; then
    install -d -m 0755 "$unit_dir/roofwatch.service.d"
    install -m 0644 "$here/process-attribution.conf" "$unit_dir/roofwatch.service.d/process-attribution.conf"
fi
# The node's settings survive upgrades: the shipped file is only a starting point.
if [ -e "$root/etc/default/roofwatch" ]; then
    echo "roofwatch: keeping existing $root/etc/default/roofwatch"
else
    install -m 0644 "$here/roofwatch.env" "$root/etc/default/roofwatch"
fi

if [ "${ROOFWATCH_NO_SYSTEMCTL:-0}" = 1 ]; then
    echo "roofwatch: files installed; systemctl skipped (ROOFWATCH_NO_SYSTEMCTL=1)"
    exit 0
fi

# SupplementaryGroups= in the unit fails the start (216/GROUP) for a group that does not exist.
for group in video render; do
    getent group "$group" >/dev/null || groupadd --system "$group"
done
systemctl daemon-reload
# On an upgrade the running agent must load the new code.
if systemctl is-active --quiet roofwatch; then systemctl restart roofwatch; fi
systemctl enable --now roofwatch

listen=$(sed -n 's/^ROOFWATCH_LISTEN=//p' "$root/etc/default/roofwatch" | tail -n 1)
host=${listen%:*}
case $host in ""|0.0.0.0|"[::]") host=127.0.0.1 ;; esac
url="http://$host:${listen##*:}/healthz"
[ -n "$listen" ] || url=http://127.0.0.1:9477/healthz
deadline=${ROOFWATCH_HEALTH_TIMEOUT_S:-60}
waited=0
until body=$(curl -sf --max-time 2 "$url"); do
    if [ "$waited" -ge "$deadline" ]; then
        echo "roofwatch: $url not healthy after ${deadline}s; see: journalctl -u roofwatch -n 50" >&2
        systemctl --no-pager status roofwatch >&2 || true
        exit 1
    fi
    sleep 1
    waited=$((waited + 1))
done
echo "roofwatch: healthy: $body"
