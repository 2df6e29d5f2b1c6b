#!/usr/bin/env bash
# A/B in one device call: build several versions of the extension side by side, then run the
# same command against each in interleaved rounds, so that a drift of the GPU clock or of the
# peers falls on every version alike.
#
#   bash tools/ab_compare.sh [-r ROUNDS] NAME=REF [NAME=REF ...] -- COMMAND [ARGS...]
#
# REF is a git commit-ish, or "." for the working tree's tracked files as they are (uncommitted
# edits included, untracked files not). Each version is checked out into its own worktree,
# $TK_AB_DIR/NAME (default /tmp/tk_ab/NAME), and built there with `setup.py build_ext
# --inplace`, all versions at once with MAX_JOBS shared between them (TK_CUDA_ARCHS, MAX_JOBS,
# TK_OPS apply as for any build; TK_CUDA_ARCHS defaults to 90a here). Side by side, the builds
# take about as long as one on a 16-core machine. COMMAND runs from this tree, so every version
# is timed by the same code, with the version's package first on PYTHONPATH (and this tree's root
# after it, for `python -m benchmarks`); each run is headed "== NAME ROUND".
#
# Where the working tree is copied to the GPU machine without its current .git, HEAD and the
# branches there can be older than the tree: bring the commits along in an untracked bundle
# (git bundle create tmp/ab.bundle BASE..BRANCH ...), fetch it there first
# (git fetch -q tmp/ab.bundle "refs/heads/*:refs/heads/*"), name versions by commit hash, and
# check the "built NAME (hash)" lines.
#
# Examples (base against the working tree, two rounds):
#   bash tools/ab_compare.sh -r 2 base=HEAD new=. -- python -m benchmarks --ops attention --quick
#   bash tools/ab_compare.sh -r 2 base=HEAD new=. -- python tools/sustained.py --attention 16,16,3072,128
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
ROUNDS=1
if [[ $1 == -r ]]; then ROUNDS=$2; shift 2; fi
declare -a NAMES=() REFS=()
while [[ $# -gt 0 && $1 != -- ]]; do
    [[ $1 == *=* ]] || { echo "ab_compare: expected NAME=REF, got '$1'" >&2; exit 2; }
    NAMES+=("${1%%=*}"); REFS+=("${1#*=}"); shift
done
[[ $1 == -- ]] && shift
if [[ ${#NAMES[@]} -lt 1 || $# -lt 1 ]]; then
    echo "usage: bash tools/ab_compare.sh [-r ROUNDS] NAME=REF [NAME=REF ...] -- COMMAND [ARGS...]" >&2
    exit 2
fi
AB_DIR=${TK_AB_DIR:-/tmp/tk_ab}
export TK_CUDA_ARCHS=${TK_CUDA_ARCHS:-90a} MAX_JOBS=${MAX_JOBS:-16}
# As in gpu_check.sh: a CXX wrapper that links libstdc++ statically makes any C++ exception
# thrown by an op (an argument check) crash the process.
export CXX=${TK_CXX:-g++}
mkdir -p "$AB_DIR"

# Check out every version, then build them all at once (the compile jobs shared between them:
# one build is mostly a single long nvcc step, so side by side they take about as long as one).
declare -a HASHES=()
for i in "${!NAMES[@]}"; do
    ref=${REFS[$i]} dir=$AB_DIR/${NAMES[$i]}
    if [[ $ref == . ]]; then
        # A commit object of the working tree's tracked files, made without touching the tree.
        ref=$(git stash create)
        ref=${ref:-HEAD}
    fi
    git worktree remove --force "$dir" > /dev/null 2>&1 || rm -rf "$dir"
    git worktree prune
    git worktree add --detach --quiet "$dir" "$ref" || { echo "ab_compare: cannot check out $ref" >&2; exit 1; }
    HASHES+=("$(git rev-parse --short "$ref")")
done
export MAX_JOBS=$(( (MAX_JOBS + ${#NAMES[@]} - 1) / ${#NAMES[@]} ))
start=$SECONDS
declare -a PIDS=()
for name in "${NAMES[@]}"; do
    (cd "$AB_DIR/$name" && python setup.py build_ext --inplace > "$AB_DIR/$name.build.log" 2>&1) &
    PIDS+=($!)
done
for i in "${!NAMES[@]}"; do
    name=${NAMES[$i]} dir=$AB_DIR/${NAMES[$i]}
    if ! wait "${PIDS[$i]}"; then
        echo "ab_compare: building $name (${HASHES[$i]}) failed; see $AB_DIR/$name.build.log" >&2
        grep -m 10 -i "error" "$AB_DIR/$name.build.log" >&2
        exit 1
    fi
    # The version must import from its own worktree (an installed copy must not shadow it).
    where=$(cd / && PYTHONPATH="$dir/python" python -c "import thunderkittens; print(thunderkittens.__file__)" 2>&1)
    if [[ $where != "$dir/python/"* ]]; then
        echo "ab_compare: $name imports thunderkittens from '$where', not from $dir/python" >&2
        exit 1
    fi
    echo "built $name (${HASHES[$i]}) in $((SECONDS - start))s"
done

status=0
for ((round = 1; round <= ROUNDS; round++)); do
    for name in "${NAMES[@]}"; do
        echo "== $name $round"
        PYTHONPATH="$AB_DIR/$name/python:$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$@" || status=$?
    done
done
exit $status
