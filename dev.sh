#!/usr/bin/env bash
# roofwatch's one entry point for people and CI. Each command sets up what it needs first.
#
#   ./dev.sh demo [ARGS...]   run the agent on the built-in virtual 8-GPU node (roofwatch demo ARGS)
#   ./dev.sh test [ARGS...]   run the whole test suite in parallel (pytest ARGS); -m "not slow": the quick tier
#   ./dev.sh bench [ARGS...]  measure the agent's cost against its budgets (python -m benchmarks ARGS);
#                             bench --fleet [ARGS...]: rules and dashboards at fleet size (benchmarks.fleet)
#   ./dev.sh image [default] [amd]  build the container image (amd: the [amd] variant) as an OCI
#                             archive per variant under dist/, for skopeo copy or the release workflow
#   ./dev.sh setup            only create/refresh the virtualenv
#
# Setup: a virtualenv in .venv (override with ROOFWATCH_VENV) with roofwatch installed editable,
# and for tests the Debian packages prometheus, prometheus-alertmanager, systemd, nodejs, npm, tmux,
# chromium, shellcheck, victoria-metrics, mmdebstrap, buildah and umoci (promtool, amtool, systemd-analyze,
# node, a terminal, a headless browser, a shell linter, VictoriaMetrics with vmagent and vmalert, the image
# build and its check), installed with apt when root or with password-less sudo.
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
    command -v shellcheck >/dev/null 2>&1 || packages+=(shellcheck)  # the scripts, and the workflows' steps (actionlint)
    command -v victoria-metrics >/dev/null 2>&1 && command -v vmagent >/dev/null 2>&1 \
        && command -v vmalert >/dev/null 2>&1 || packages+=(victoria-metrics)  # remote write, vmagent, vmalert
    local image_tools
    mapfile -t image_tools < <(missing_image_tools)   # the slow tier builds the image and runs roofwatch inside it
    packages+=("${image_tools[@]}")
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

missing_image_tools() {
    # ./dev.sh image: mmdebstrap makes the Debian base from Debian's archive (no container registry
    # needed), buildah builds the Dockerfile on it (chroot isolation, vfs storage: no daemon, no
    # overlay mounts); the tests unpack the result with umoci to run roofwatch inside it.
    command -v mmdebstrap >/dev/null 2>&1 || echo mmdebstrap
    command -v buildah >/dev/null 2>&1 || echo buildah
    command -v umoci >/dev/null 2>&1 || echo umoci
}

python_version() {
    # The one place the version is written: agent/__init__.py's __version__ (pyproject.toml reads it).
    sed -n 's/^__version__ = "\(.*\)"$/\1/p' agent/__init__.py
}

build_image() {
    # ./dev.sh image [default] [amd]: the image from the Dockerfile, over nothing but Debian's archive
    # and the package registries (no container registry):
    #  1. a Debian bookworm base (python3, its venv module, CA certificates) made by mmdebstrap and
    #     imported into a private buildah store in a temporary directory (removed afterwards);
    #  2. a wheelhouse of roofwatch's dependencies for that base's Python and machine, fetched here
    #     with this machine's pip settings (its index and CA), so the build itself needs no network;
    #  3. the Dockerfile built on that base for each variant, pushed to dist/roofwatch-VERSION[-amd]-oci.tar.
    # ROOFWATCH_IMAGE_BASE=IMAGE builds on that image instead of step 1 (pulled where a registry is
    # reachable); ROOFWATCH_IMAGE_OUT=DIR writes the archives there; ROOFWATCH_DEBIAN_MIRROR=URL.
    local variants=("$@") variant
    [ ${#variants[@]} -gt 0 ] || variants=(default)
    for variant in "${variants[@]}"; do
        case "$variant" in default|amd) ;; *) die "usage: ./dev.sh image [default] [amd]" ;; esac
    done
    [ "$(id -u)" = 0 ] || die "building the image needs root (mmdebstrap, buildah with chroot isolation): sudo ./dev.sh image ${variants[*]}"
    local missing
    missing=$(missing_image_tools | xargs)
    if [ -n "$missing" ]; then
        # shellcheck disable=SC2086  # a list of package names
        apt_install $missing || die "cannot install $missing: run 'apt-get install $missing'"
    fi
    [ -x "$VENV/bin/python" ] || ensure_venv ""   # its pip (this machine's index and CA) fetches the wheels
    local version revision repository out work base
    version=$(python_version)
    [ -n "$version" ] || die "no __version__ = \"...\" line in agent/__init__.py"
    revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
    if [ "$revision" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
        revision="$revision-dirty"   # the tree is not that commit
    fi
    repository=$(sed -n 's/^  repository: *//p' deploy/helm/roofwatch/values.yaml | head -n 1)  # the image the chart runs
    [ -n "$repository" ] || die "no image repository in deploy/helm/roofwatch/values.yaml"
    out=${ROOFWATCH_IMAGE_OUT:-dist}
    mkdir -p "$out"
    work=$(mktemp -d "${TMPDIR:-/tmp}/roofwatch-image.XXXXXX")
    # shellcheck disable=SC2064  # expand $work now
    trap "rm -rf '$work'" EXIT
    local store=(--root "$work/store" --runroot "$work/run" --storage-driver vfs)

    base=${ROOFWATCH_IMAGE_BASE:-}
    if [ -z "$base" ]; then
        local mirror=${ROOFWATCH_DEBIAN_MIRROR:-http://deb.debian.org}
        say "building a Debian bookworm base (python3, python3-venv, ca-certificates, libstdc++6) with mmdebstrap from $mirror"
        mmdebstrap --quiet --variant=essential --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
            --include=python3,python3-venv,ca-certificates,libstdc++6 \
            --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
            --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
            --dpkgopt='path-include=/usr/share/doc/*/copyright' \
            bookworm "$work/base.tar" \
            "deb $mirror/debian bookworm main" "deb $mirror/debian bookworm-updates main" \
            "deb $mirror/debian-security bookworm-security main" </dev/null ||
            die "mmdebstrap could not build the base from $mirror (ROOFWATCH_DEBIAN_MIRROR names another Debian mirror)"
        local container
        container=$(buildah "${store[@]}" from scratch)
        buildah "${store[@]}" add --quiet "$container" "$work/base.tar" /
        buildah "${store[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
            --env LANG=C.UTF-8 --cmd /bin/sh "$container"
        buildah "${store[@]}" commit --quiet --rm "$container" localhost/roofwatch-base:bookworm >/dev/null
        rm -f "$work/base.tar"
        base=localhost/roofwatch-base:bookworm
    fi

    # The base's own Python and machine say which wheels it can load.
    local probe target pyver glibc machine platforms=()
    probe=$(buildah "${store[@]}" from --quiet --pull=missing "$base")
    target=$(buildah "${store[@]}" run --isolation chroot "$probe" -- python3 -c \
        'import platform, sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}", platform.libc_ver()[1], platform.machine())') ||
        die "$base has no working python3"
    buildah "${store[@]}" rm "$probe" >/dev/null
    read -r pyver glibc machine <<<"$target"
    local minor=${glibc#2.}
    if [ -z "$glibc" ] || [ "$glibc" = "$minor" ]; then die "$base: no glibc version (musl bases are not supported)"; fi
    for ((; minor >= 5; minor--)); do platforms+=(--platform "manylinux_2_${minor}_$machine"); done
    platforms+=(--platform "manylinux2014_$machine")
    say "fetching roofwatch's dependencies as wheels for Python $pyver on $machine (glibc $glibc)"
    mkdir "$work/src"   # what the Dockerfile copies, built apart from the checkout (no build/ left in it)
    cp -r pyproject.toml README.md LICENSE agent exporters "$work/src/"
    "$VENV/bin/python" -m pip wheel --quiet --quiet --no-deps --wheel-dir "$work/own" "$work/src" ||
        die "cannot build roofwatch's wheel"
    local wheel
    wheel=$(ls "$work"/own/roofwatch-*.whl)
    "$VENV/bin/python" -m pip download --quiet --quiet --dest "$work/wheelhouse" \
        --only-binary=:all: --python-version "$pyver" --implementation cp \
        --abi "cp${pyver/./}" --abi abi3 --abi none "${platforms[@]}" \
        "${wheel}[amd]" "setuptools>=77" wheel ||
        die "cannot fetch roofwatch's dependencies for Python $pyver on $machine"
    rm -f "$work"/wheelhouse/roofwatch-*.whl   # the image builds roofwatch from this checkout's source

    local extras suffix tag archive
    for variant in "${variants[@]}"; do
        extras="" suffix=""
        [ "$variant" = default ] || extras=$variant suffix=-$variant
        tag="$repository:$version$suffix"
        archive="$out/roofwatch-$version$suffix-oci.tar"
        say "building $tag from the Dockerfile"
        buildah "${store[@]}" build --quiet --isolation chroot --pull=never --layers=false \
            --volume "$work/wheelhouse:/wheelhouse:ro" \
            --build-arg PYTHON_IMAGE="$base" --build-arg EXTRAS="$extras" \
            --build-arg VERSION="$version" --build-arg REVISION="$revision" \
            --build-arg PIP_INSTALL_OPTIONS="--no-index --find-links=/wheelhouse" \
            --tag "$tag" --file Dockerfile . >/dev/null
        rm -f "$archive"
        buildah "${store[@]}" push --quiet "$tag" "oci-archive:$archive:$tag"
        say "wrote $archive ($tag, $(du -m "$archive" | cut -f1) MiB); push it with: skopeo copy oci-archive:$archive docker://$tag"
    done
}

ensure_test_wheels() {
    # The version-matrix tests load every nvidia-ml-py and amdsmi release we accept (tests/wheels.py);
    # fetched here, before pytest, since the quick tier starts no child process such as pip.
    "$VENV/bin/python" -m tests.wheels ||
        say "could not fetch every release of the version matrix (above): those tests will fail until it can"
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

# What a first run on a fresh clone would otherwise charge to the first property test of each worker, past the
# quick tier's 2 s per test (tests/tiers.py): Hypothesis's per-checkout caches under .hypothesis/, built here before
# any test is timed and kept for later runs. Its Unicode categories and the code points UTF-8 encodes (it encodes
# all 1.1 million), and the literals of every local source file, which it parses on a test's first draw after
# the module was imported, to use as examples: every module of ours and the vendor releases in .whl/ (each
# pynvml.py and amdsmi_wrapper.py of the test matrix, thousands of lines each). Outside pytest, whose plugin loading Hypothesis asks to keep light;
# these are Hypothesis internals, so a release that moves them costs only the old first-run time.
warm_first_run() {
    "$VENV/bin/python" - <<'PY' 2>/dev/null || true
import pathlib, types
from hypothesis.internal.charmap import charmap, intervals_from_codec
from hypothesis.internal.constants_ast import constants_from_module
charmap()
intervals_from_codec("utf-8")
for top in ("agent", "exporters", "dashboards", "deploy", "benchmarks", "traces", ".whl"):
    for path in sorted(pathlib.Path(top).rglob("*.py")):
        module = types.ModuleType(path.stem)
        module.__file__ = str(path.resolve())
        constants_from_module(module)
PY
}

case "$cmd" in
    demo)
        ensure_venv "[amd]"   # the amdsmi wrapper, for --backend amd-virtual (no ROCm needed)
        exec "$VENV/bin/roofwatch" demo "$@"
        ;;
    test)
        ensure_venv "[test]"
        ensure_test_tools
        ensure_test_wheels
        # Compiled test modules are kept between runs (pytest's assertion rewriting costs ~8 s a run otherwise).
        unset PYTHONDONTWRITEBYTECODE
        warm_first_run
        # shellcheck disable=SC2046  # parallel_args prints one argument per word
        exec "$VENV/bin/python" -m pytest $(parallel_args "$@") "$@"
        ;;
    image)
        build_image "$@"
        ;;
    bench)
        ensure_venv "[bench]"
        exec "$VENV/bin/python" -m benchmarks "$@"
        ;;
    setup)
        ensure_venv "[test]"
        ;;
    *)
        awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"   # the header above
        [ "$cmd" = help ] || exit 2
        ;;
esac
