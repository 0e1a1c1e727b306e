#!/usr/bin/env bash
# benchmarks/gpu.py on a lent GPU machine whose python3 (3.12) has cupy and torch but no islpy or lark.
#
#   bash benchmarks/gpu_setup.sh prepare        # here: fill .gpu/ (git-ignored), the folder to carry
#   bash benchmarks/gpu_setup.sh run [ARGS...]  # there: install .gpu/whl, run benchmarks/gpu.py ARGS
#
# prepare: downloads cp312 manylinux x86_64 wheels of the islpy and lark versions this checkout's
# environment uses (pip download, no dependencies: neither needs any at run time) into .gpu/whl,
# builds a wheel of this checkout's tcdsl there, and copies ../shared/conformance/cases.py to
# .gpu/conformance/ (../shared does not travel to the device machine; gpu.py finds the copy there).
# run: pip-installs those wheels into /tmp/tcdsl-site (no index, no network), puts it on PYTHONPATH,
# prints the GPU's state, runs the test suite's CUDA tests (those named cuda, and the GPU scatter;
# at most $TCDSL_GPU_TESTS_S seconds, default 150, 0 skips them) and then gpu.py. When $OUT is set
# (the device tool's output folder), the logs and the JSON results are written there too. The exit
# status is gpu.py's, or the tests' when they fail.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=.gpu
SITE=/tmp/tcdsl-site

case "${1:-run}" in
prepare)
    PY=${PYTHON:-.venv/bin/python}
    [ -x "$PY" ] || PY=python3
    islpy_v=$("$PY" -c 'import importlib.metadata as m; print(m.version("islpy"))')
    lark_v=$("$PY" -c 'import importlib.metadata as m; print(m.version("lark"))')
    rm -rf "$DIR/whl" "$DIR/conformance"
    mkdir -p "$DIR/whl" "$DIR/conformance"
    platforms=()
    for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
             manylinux1_x86_64; do
        platforms+=(--platform "$p")
    done
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d "$DIR/whl" "islpy==$islpy_v" "lark==$lark_v"
    "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DIR/whl" .
    cases=../shared/conformance/cases.py
    if [ -f "$cases" ]; then
        cp "$cases" "$DIR/conformance/cases.py"
    else
        echo "warning: no $cases: the device run will skip conformance (or pass --cases)" >&2
    fi
    ls -l "$DIR/whl" "$DIR/conformance"
    tree_kib=$(git ls-files -co --exclude-standard -z | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1)
    carry_kib=$(du -sk "$DIR" | cut -f1)
    echo "working tree ${tree_kib} KiB + carried $DIR ${carry_kib} KiB (the device tool's limit: 65536 KiB)"
    echo "device call: run(command='bash benchmarks/gpu_setup.sh run', carry=['$DIR'], timeout_s=480)"
    ;;
run)
    shift || true
    if ! ls "$DIR"/whl/islpy-*.whl >/dev/null 2>&1; then
        echo "no $DIR/whl/islpy-*.whl: run 'bash benchmarks/gpu_setup.sh prepare' first and carry $DIR" >&2
        exit 2
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$DIR"/whl/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,memory.used \
        --format=csv 2>/dev/null || true
    log=/dev/null
    [ -n "${OUT:-}" ] && mkdir -p "$OUT" && log="$OUT/tests.log"
    tests_rc=0
    if [ "${TCDSL_GPU_TESTS_S:-150}" != 0 ]; then
        set -o pipefail
        # from tests/: the checkout's root would shadow the installed package on sys.path
        (cd tests && timeout "${TCDSL_GPU_TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider \
            test_gpu.py test_scatter.py test_empty_ranges.py -k "cuda or gpu_scatters") 2>&1 | tee "$log" \
            || tests_rc=$?
        set +o pipefail
    fi
    args=("$@")
    bench_rc=0
    if [ -n "${OUT:-}" ]; then
        args+=(--json "$OUT/gpu.json")
        set -o pipefail
        python3 benchmarks/gpu.py "${args[@]}" 2>&1 | tee "$OUT/gpu.log" || bench_rc=$?
    else
        python3 benchmarks/gpu.py "${args[@]}" || bench_rc=$?
    fi
    [ "$tests_rc" != 0 ] && echo "the CUDA tests failed (exit $tests_rc)" && exit "$tests_rc"
    exit "$bench_rc"
    ;;
*)
    echo "usage: bash benchmarks/gpu_setup.sh prepare | run [gpu.py arguments]" >&2
    exit 2
    ;;
esac
