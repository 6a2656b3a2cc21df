#!/usr/bin/env bash
# roofwatch's one entry point for people and CI. Each command sets up what it needs first.
#
#   ./dev.sh demo [ARGS...]   run the agent on the built-in virtual 8-GPU node (roofwatch demo ARGS)
#   ./dev.sh test [ARGS...]   run the whole test suite in parallel (pytest ARGS); -m "not slow": the quick tier
#   ./dev.sh bench [ARGS...]  measure the agent's cost against its budgets (python -m benchmarks ARGS);
#                             bench --fleet [ARGS...]: rules and dashboards at fleet size (benchmarks.fleet)
#   ./dev.sh setup            only create/refresh the virtualenv
#
# Setup: a virtualenv in .venv (override with ROOFWATCH_VENV) with roofwatch installed editable,
# and for tests the Debian packages prometheus, prometheus-alertmanager, systemd, nodejs, npm, tmux,
# chromium and victoria-metrics (promtool, amtool, systemd-analyze, node, a terminal, a headless browser,
# VictoriaMetrics with vmagent and vmalert), installed
# with apt when root or with password-less sudo.
set -euo pipefail
cd "$(dirname "$0")"

VENV=${ROOFWATCH_VENV:-.venv}
PYTHON=${PYTHON:-python3}

say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo "$@"
    else return 1
    fi
}

apt_install() {
    say "installing Debian packages: $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

check_python() {
    command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found: install Python 3.10 or newer (apt-get install python3)"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
        die "roofwatch needs Python >= 3.10; $PYTHON is $("$PYTHON" -V 2>&1)"
}

ensure_venv() {
    local extras=$1
    check_python
    if [ ! -x "$VENV/bin/python" ]; then
        say "creating virtualenv $VENV"
        if ! "$PYTHON" -m venv "$VENV" 2>/dev/null; then
            rm -rf "$VENV"
            local pyver
            pyver=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
            apt_install "python${pyver}-venv" || apt_install python3-venv ||
                die "python venv support is missing: run 'sudo apt-get install python3-venv' and retry"
            "$PYTHON" -m venv "$VENV"
        fi
    fi
    local stamp="$VENV/.roofwatch-installed-$extras"
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        say "installing roofwatch and its dependencies into $VENV"
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".$extras"
        touch "$stamp"
    fi
}

ensure_test_tools() {
    # The tests run the real tools: promtool and prometheus (rules, scrapes), amtool (routing),
    # systemd-analyze (the unit file), victoria-metrics, vmagent and vmalert, node and npm (Grafana's own transformation code, which the
    # tests npm-ci into tests/grafana), tmux and chromium. Install what is missing in one apt call.
    local packages=() had_service=0
    command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || packages+=(prometheus)
    command -v amtool >/dev/null 2>&1 || packages+=(prometheus-alertmanager)
    command -v systemd-analyze >/dev/null 2>&1 || packages+=(systemd)
    command -v node >/dev/null 2>&1 || packages+=(nodejs)
    command -v npm >/dev/null 2>&1 || packages+=(npm)
    command -v tmux >/dev/null 2>&1 || packages+=(tmux)          # roofwatch top, driven with send-keys
    command -v chromium >/dev/null 2>&1 || packages+=(chromium)  # the status page and the report, rendered headless
    command -v victoria-metrics >/dev/null 2>&1 && command -v vmagent >/dev/null 2>&1 \
        && command -v vmalert >/dev/null 2>&1 || packages+=(victoria-metrics)  # remote write, vmagent, vmalert
    [ ${#packages[@]} -eq 0 ] && return 0
    [ -e /lib/systemd/system/prometheus.service ] && had_service=1
    if apt_install "${packages[@]}"; then
        # The packages start servers where systemd runs; tests start their own.
        if [ "$had_service" = 0 ] && command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
            as_root systemctl disable --now prometheus prometheus-node-exporter prometheus-alertmanager victoria-metrics >/dev/null 2>&1 || true
        fi
    else
        say "cannot install ${packages[*]} without root: run 'sudo apt-get install ${packages[*]}'."
        say "Tests that need these tools will fail or be skipped until then."
    fi
}

parallel_args() {
    # The suite runs in parallel (pytest-xdist) unless the caller chose (-n, -p no:xdist) or asked for
    # a debugger. The whole suite: one worker more than there are cores, since its slow tests spend
    # about a third of their time waiting on servers, and a test file per worker at a time (--dist
    # loadfile: a file's module fixtures, such as a fleet of agents and a Prometheus, start once).
    # The quick tier (-m "not slow") is all computation: a worker per core, tests handed out one by
    # one as workers free up (--dist worksteal). ROOFWATCH_TEST_WORKERS overrides the count.
    local arg cores workers dist
    for arg in "$@"; do
        case "$arg" in
            -n|-n*|--numprocesses*|--pdb|--trace|no:xdist|-pno:xdist) return 0 ;;
        esac
    done
    cores=$(nproc 2>/dev/null || echo 2)
    workers=$((cores + 1)) dist=loadfile
    case " $* " in *"not slow"*) workers=$cores dist=worksteal ;; esac
    printf '%s\n' -n "${ROOFWATCH_TEST_WORKERS:-$workers}" --dist "$dist"
}

cmd=${1:-help}
[ $# -gt 0 ] && shift
case "$cmd" in
    demo)
        ensure_venv "[amd]"   # the amdsmi wrapper, for --backend amd-virtual (no ROCm needed)
        exec "$VENV/bin/roofwatch" demo "$@"
        ;;
    test)
        ensure_venv "[test]"
        ensure_test_tools
        # Compiled test modules are kept between runs (pytest's assertion rewriting costs ~8 s a run otherwise).
        unset PYTHONDONTWRITEBYTECODE
        exec "$VENV/bin/python" -m pytest $(parallel_args "$@") "$@"
        ;;
    bench)
        ensure_venv "[bench]"
        exec "$VENV/bin/python" -m benchmarks "$@"
        ;;
    setup)
        ensure_venv "[test]"
        ;;
    *)
        sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
        [ "$cmd" = help ] || exit 2
        ;;
esac
