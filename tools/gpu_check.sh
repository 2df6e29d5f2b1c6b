#!/usr/bin/env bash
# The one-call GPU check: environment, build, full pytest, compute-sanitizer, SASS census,
# benchmarks; logs and JSON under $OUT (default ./gpu_out), a compact summary printed last.
#
#   bash tools/gpu_check.sh
#
# Knobs (environment):
#   OUT               where logs go (default ./gpu_out)
#   TK_CUDA_ARCHS     build targets (default 90a: Hopper)
#   MAX_JOBS          parallel compile jobs (default 16)
#   TK_CHECK_STEPS    steps to run, comma list of build,test,sanitize,bench (default all). Split a
#                     long check over calls: the build stays on a warm machine. `test` is the whole
#                     suite; `test-fixed` (all but the differential suite, test_differential_*.py)
#                     and `test-differential` are its two halves, for when build and the whole
#                     suite do not fit one 10-minute call.
#   TK_SANITIZERS     compute-sanitizer tools (default memcheck,racecheck; synccheck also works)
#   TK_SANITIZE_SCRIPTS  which tools/sanitize_<op>.py to run (default "attention attention_backward decode matmul based fftconv differential")
#   TK_BENCH_ARGS     extra arguments for python -m benchmarks (e.g. --quick)
#   TK_PYTEST_ARGS    extra arguments for pytest (default where pytest-xdist is installed: "-n 8"
#                     on GPUs of more than 100 GB, "-n 4" below: the GPU tests are independent;
#                     with --dist worksteal)
#   TK_CHECK_BUDGET_S seconds the whole check may take (default 570, to fit a 10-minute limit on
#                     one command); steps are cut short or skipped so the summary still prints
#   PYTHON            interpreter (default python3)
#
# Every step runs even when an earlier one failed. The exit status is non-zero if any failed:
# pytest's own exit status when pytest failed (it fails, among others, when GPU tests were skipped
# on a GPU machine because no kernel was chosen), else 1.
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)

STEPS=${TK_CHECK_STEPS:-build,test,sanitize,bench}
# A misspelt step would otherwise be skipped without a word, and the check pass having run nothing.
for step in ${STEPS//,/ }; do
    case $step in
        build | test | test-fixed | test-differential | sanitize | bench) ;;
        *) echo "TK_CHECK_STEPS: unknown step '$step' (steps: build, test, test-fixed," \
               "test-differential, sanitize, bench)" >&2
           exit 2 ;;
    esac
done
OUT=${OUT:-./gpu_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
SANITIZERS=${TK_SANITIZERS:-memcheck,racecheck}
BUDGET=${TK_CHECK_BUDGET_S:-570}
export TK_CUDA_ARCHS=${TK_CUDA_ARCHS:-90a}
export MAX_JOBS=${MAX_JOBS:-16}

declare -a SUMMARY=()
FAILED=0

want() { [[ ",$STEPS," == *",$1,"* ]]; }
# The test step's pytest paths: the whole suite, or one of its halves.
TEST_PATHS=()
if want test || { want test-fixed && want test-differential; }; then TEST_PATHS=(tests)
else
    want test-fixed && TEST_PATHS+=(tests --ignore=tests/test_differential_gpu.py
                                    --ignore=tests/test_differential_cpu.py)
    want test-differential && TEST_PATHS+=(tests/test_differential_gpu.py tests/test_differential_cpu.py)
fi
want_tests() { ((${#TEST_PATHS[@]} > 0)); }
note() { SUMMARY+=("$1"); }
banner() { echo "== $* ($(date +%H:%M:%S))"; }

# run_step NAME LIMIT_S COMMAND...: runs with a time limit, records ok/FAILED/TIMEOUT + seconds.
# The limit is cut to what is left of the overall budget, so the summary is always printed
# before the caller's own time limit (a step that no longer fits is skipped, and the run fails).
run_step() {
    local name=$1 limit=$2
    shift 2
    local remaining=$((BUDGET - SECONDS - 20))
    if ((remaining < 30)); then
        note "$(printf '%-10s SKIPPED: time budget (TK_CHECK_BUDGET_S=%s) used up; run it with TK_CHECK_STEPS' "$name" "$BUDGET")"
        FAILED=1
        return 125
    fi
    ((limit > remaining)) && limit=$remaining
    local start=$SECONDS rc
    timeout --signal=TERM --kill-after=15 "$limit" "$@"
    rc=$?
    local took=$((SECONDS - start))
    if [[ $rc -eq 0 ]]; then
        note "$(printf '%-10s ok (%ss)' "$name" "$took")"
    elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
        note "$(printf '%-10s TIMEOUT after %ss' "$name" "$took")"
        FAILED=1
    else
        note "$(printf '%-10s FAILED rc=%s (%ss)' "$name" "$rc" "$took")"
        FAILED=1
    fi
    return $rc
}

find_tool() {
    command -v "$1" 2>/dev/null && return
    for candidate in "/usr/local/cuda/bin/$1" "/usr/local/cuda/$1/$1"; do
        [[ -x $candidate ]] && { echo "$candidate"; return; }
    done
}

# ---- environment ----------------------------------------------------------------------------
banner environment
{
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv,noheader
    nvidia-smi
    "$PY" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| CUDA', torch.version.cuda, '| GPUs', torch.cuda.device_count())"
    nvcc --version | tail -2
    echo "TK_CUDA_ARCHS=$TK_CUDA_ARCHS MAX_JOBS=$MAX_JOBS STEPS=$STEPS"
} > "$OUT/env.log" 2>&1
GPU_LINE=$(nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>/dev/null | head -1)
TORCH_LINE=$("$PY" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| CUDA', torch.version.cuda)" 2>&1 | tail -1)
NVCC_LINE=$(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*, V[0-9.]*')
echo "GPU: $GPU_LINE"; echo "$TORCH_LINE"; echo "nvcc: $NVCC_LINE"

# ---- build ----------------------------------------------------------------------------------
# Some machines set CXX to a wrapper that links libstdc++ statically into shared objects; a
# second libstdc++ inside _C crashed (SIGSEGV in ostream) on the first TORCH_CHECK message that
# formats a number. Build with the g++ first on PATH unless TK_CXX names another; the check after
# the build catches a static libstdc++ anyway.
export CXX=${TK_CXX:-g++}
if want build; then
    banner "build (TK_CUDA_ARCHS=$TK_CUDA_ARCHS, MAX_JOBS=$MAX_JOBS)"
    run_step build 480 env TK_PTXAS_VERBOSE=1 \
        "$PY" -m pip install --no-build-isolation --no-deps -v -e . > "$OUT/build.log" 2>&1
    rc=$?
    if [[ $rc -ne 0 && $rc -ne 124 && $rc -ne 137 ]]; then
        # pip's editable route needs a recent setuptools (or wheel); building in place works
        # with any, and PYTHONPATH above makes the in-tree package importable. The pip failure
        # stays in the summary; the run fails only if this fails too (build is the first step
        # that can fail, so clearing FAILED forgets nothing else).
        SUMMARY[-1]="build      pip -e failed (rc=$rc, see build.log); retried: setup.py build_ext --inplace"
        FAILED=0
        run_step build_ext 480 env TK_PTXAS_VERBOSE=1 \
            "$PY" setup.py build_ext --inplace >> "$OUT/build.log" 2>&1
    fi
    # ptxas -v: registers / spills / shared memory per kernel and arch.
    "$PY" tools/kernel_report.py ptxas "$OUT/build.log" > "$OUT/ptxas.log" 2>&1
    grep -E "error|Error" "$OUT/build.log" | grep -v -- "-Werror" | head -20 > "$OUT/build_errors.log"
    # ptxas C7512: wgmma serialized (a wait after every instruction) for lack of registers.
    grep -o "C7512.*function '[^']*'" "$OUT/build.log" | sed "s/.*function '//; s/'$//" | sort -u \
        > "$OUT/wgmma_serialized.log"
fi

SO=$(ls "$ROOT"/python/thunderkittens/_C*.so 2>/dev/null | head -1)
if want build && [[ -n $SO ]] && ! ldd "$SO" | grep -q 'libstdc++'; then
    note "build      FAILED: _C has libstdc++ linked in statically (CXX=$CXX); C++ exceptions can crash"
    FAILED=1
fi

# The later steps must import this tree's build. The editable install does that; if it is gone
# (a later call on the machine) or another copy shadows it, put the tree first on the path. Not
# done before the build: pip would take the tree's egg-info for an installed copy.
package_dir() { (cd / && "$PY" -c "import os, thunderkittens; print(os.path.dirname(thunderkittens.__file__))" 2>/dev/null); }
if [[ $(package_dir) != "$ROOT/python/thunderkittens" ]]; then
    export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
fi
PACKAGE_LINE="thunderkittens from $(package_dir || echo '(not importable)')"

# ---- tests ----------------------------------------------------------------------------------
PYTEST_RC=0
if want_tests; then
    banner "pytest ${TEST_PATHS[*]}"
    rm -f "$OUT/junit.xml"
    if [[ -z ${TK_PYTEST_ARGS+set} ]] && "$PY" -c "import xdist" 2> /dev/null; then
        # 8 workers (each with the differential suite's case servers) ran an 80 GB H100 out of
        # memory; the 139 GB H200 takes them.
        GPU_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
        # worksteal: the differential suite's shards, collected last, went to one worker and
        # ran there one after another while the others sat idle.
        if [[ ${GPU_MIB:-0} -gt 100000 ]]; then TK_PYTEST_ARGS="-n 8"; else TK_PYTEST_ARGS="-n 4"; fi
        TK_PYTEST_ARGS="$TK_PYTEST_ARGS --dist worksteal"
    fi
    # shellcheck disable=SC2086  # TK_PYTEST_ARGS is a list of words
    # -v: one line per test as it ends, so a run cut short by the time limit still names its
    # failures (grep ' FAILED ' pytest.log).
    run_step pytest 540 "$PY" -m pytest "${TEST_PATHS[@]}" -v -rfEs ${TK_PYTEST_ARGS:-} --junitxml="$OUT/junit.xml" \
        -p no:benchmark > "$OUT/pytest.log" 2>&1
    PYTEST_RC=$?
fi

# ---- SASS census ----------------------------------------------------------------------------
# After the tests: on an 80 GB H100 the build and the full pytest alone take most of one
# 10-minute call, and the census (half a minute) can wait.
CUOBJDUMP=$(find_tool cuobjdump)
if want build && [[ -n $SO && -n $CUOBJDUMP ]]; then
    banner "SASS census ($CUOBJDUMP)"
    "$CUOBJDUMP" --dump-sass "$SO" > "$OUT/sass.txt" 2>&1
    # Per kernel and arch: tensor-core, ldmatrix, cp.async, TMA, shared/global instructions.
    "$PY" tools/kernel_report.py sass "$OUT/sass.txt" > "$OUT/sass_counts.log" 2>&1
    # Where the spills are: local loads/stores per kernel, and how many in tensor-core loops.
    "$PY" tools/kernel_report.py local "$OUT/sass.txt" > "$OUT/sass_local.log" 2>&1
    gzip -f "$OUT/sass.txt"
fi

# "passed P, failed F, errors E, skipped S (of T)" from pytest's JUnit XML.
pytest_counts() {
    "$PY" - "$1" <<'EOF' 2>/dev/null
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
n = {key: sum(int(suite.get(key, 0)) for suite in suites) for key in ("tests", "failures", "errors", "skipped")}
passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
print(f"passed {passed}, failed {n['failures']}, errors {n['errors']}, skipped {n['skipped']} (of {n['tests']})")
EOF
}

# ---- compute-sanitizer ----------------------------------------------------------------------
SANITIZER=$(find_tool compute-sanitizer)
if want sanitize; then
    if [[ -z $SANITIZER ]]; then
        note "sanitize   FAILED: compute-sanitizer not found"
        FAILED=1
    else
        for tool in ${SANITIZERS//,/ }; do
            banner "compute-sanitizer --tool $tool"
            # racecheck looks at our kernels only: every one has "2tk" (namespace tk) in its
            # mangled name, the name --kernel-name matches (a kernel in namespace tk with a
            # planted race was reported with this filter, and missed with "tk::"). PyTorch's own
            # kernels (references, fallbacks) showed thousands of hazards in its memory-efficient
            # attention backward and took the differential sample past 5 minutes. memcheck looks
            # at every kernel: a peer's out-of-bounds access on our fallback path is ours to avoid.
            # The differential sample goes in two groups under racecheck: with the filter its
            # cuBLAS yardsticks stop racecheck itself (tools/sanitize_differential.py says which).
            filter=
            [[ $tool == racecheck ]] && filter="--kernel-name kns=2tk"
            # Without the caching allocator every tensor is its own cudaMalloc, so memcheck sees
            # accesses past the end of an output as out of bounds.
            sanitize="PYTORCH_NO_CUDA_MEMORY_CACHING=1 '$SANITIZER' --tool $tool --error-exitcode 99"
            commands=()
            for s in ${TK_SANITIZE_SCRIPTS:-attention attention_backward decode matmul based fftconv differential}; do
                if [[ $tool == racecheck && $s == differential ]]; then
                    commands+=("$sanitize $filter '$PY' tools/sanitize_differential.py --group attention"
                               "$sanitize '$PY' tools/sanitize_differential.py --group others")
                else
                    commands+=("$sanitize $filter '$PY' tools/sanitize_$s.py")
                fi
            done
            run_step "$tool" 540 bash -c "$(printf '%s || exit $?\n' "${commands[@]}")" > "$OUT/sanitize_$tool.log" 2>&1
        done
    fi
fi

# ---- benchmarks -----------------------------------------------------------------------------
if want bench; then
    banner "benchmarks"
    # shellcheck disable=SC2086
    run_step bench 400 "$PY" -m benchmarks --json "$OUT/bench.json" ${TK_BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
fi

# ---- summary --------------------------------------------------------------------------------
echo
echo "=================================== summary ==================================="
echo "GPU: $GPU_LINE | $TORCH_LINE | nvcc $NVCC_LINE | archs $TK_CUDA_ARCHS"
echo "$PACKAGE_LINE"
printf '%s\n' "${SUMMARY[@]}"
if want build; then
    if [[ -s $OUT/build_errors.log ]]; then echo "-- build errors (build.log):"; head -10 "$OUT/build_errors.log" | cut -c1-300; fi
    if [[ -s $OUT/ptxas.log ]]; then echo "-- ptxas (ptxas.log):"; cut -c1-200 "$OUT/ptxas.log" | head -24; fi
    if [[ -s $OUT/wgmma_serialized.log ]]; then
        echo "-- WARNING: ptxas serialized wgmma (C7512, too few registers) in $(wc -l < "$OUT/wgmma_serialized.log") kernels (wgmma_serialized.log)"
    fi
    if [[ -s $OUT/sass_counts.log ]]; then echo "-- SASS counts (sass_counts.log):"; cut -c1-260 "$OUT/sass_counts.log" | head -24; fi
    if [[ -f $OUT/sass_local.log ]]; then
        echo "-- SASS local memory (sass_local.log): $(grep -c ' local=' "$OUT/sass_local.log") kernels" \
             "with local loads/stores, $(grep -c -v 'in-hot-loop=0 ' "$OUT/sass_local.log") with some in a tensor-core loop"
        grep -v 'in-hot-loop=0 ' "$OUT/sass_local.log" | head -10 | cut -c1-200
    fi
fi
if want_tests && [[ -s $OUT/pytest.log ]]; then
    counts=$([[ -s $OUT/junit.xml ]] && pytest_counts "$OUT/junit.xml")
    echo "-- pytest: ${counts:-(no junit.xml)} | exit status $PYTEST_RC | $(tail -1 "$OUT/pytest.log" | cut -c1-200)"
    grep -E "^(FAILED|ERROR) " "$OUT/pytest.log" | head -25 | cut -c1-240
    # Skip reasons, grouped by pytest (-rs): on a GPU machine every skip deserves a look.
    grep -E "^SKIPPED " "$OUT/pytest.log" | head -12 | cut -c1-240
    if ((PYTEST_RC != 0)) && ! grep -qE "^(FAILED|ERROR) " "$OUT/pytest.log"; then
        # Cut short: the failures so far, from the -v lines.
        grep -oE " (FAILED|ERROR) tests/[^ ]*" "$OUT/pytest.log" | sort -u | head -25 | cut -c1-240
        echo "   pytest failed without a failing test; its last lines (pytest.log):"
        tail -6 "$OUT/pytest.log" | cut -c1-240 | sed 's/^/   /'
    fi
fi
if want sanitize; then
    for tool in ${SANITIZERS//,/ }; do
        [[ -s $OUT/sanitize_$tool.log ]] || continue
        echo "-- $tool: $(grep -h 'ERROR SUMMARY' "$OUT/sanitize_$tool.log" | tr '\n' ' ')" \
             "| $(grep -h '^sanitize_[a-z_]*:' "$OUT/sanitize_$tool.log" | tr '\n' ' ')"
        grep -m 5 -E "^========= (Invalid|Race|Barrier|Error|.*hazard)" "$OUT/sanitize_$tool.log" | cut -c1-200
    done
fi
if want bench && [[ -s $OUT/bench.log ]]; then
    echo "-- benchmarks (bench.log, bench.json):"
    if grep -q '^attention (' "$OUT/bench.log"; then
        sed -n '/^attention (/,$p' "$OUT/bench.log"
    else
        tail -15 "$OUT/bench.log" | cut -c1-300
    fi
fi
echo "logs: $OUT"
if ((PYTEST_RC != 0)); then
    echo "FAILED: pytest exited with status $PYTEST_RC"
    exit $PYTEST_RC
fi
((FAILED)) && echo "FAILED: see the steps above"
exit $FAILED
