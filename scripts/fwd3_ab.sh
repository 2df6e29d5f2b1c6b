#!/usr/bin/env bash
# EXPERIMENT (branch fwd-three-d128): build attention, check the 3-consumer d128 forward, A/B it.
cd "$(dirname "$0")/.." || exit 1
export CXX=g++ TK_CUDA_ARCHS=90a PYTHONUNBUFFERED=1
S=$SECONDS
TK_OPS=attention MAX_JOBS=16 python setup.py build_ext --inplace > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "built $((SECONDS-S))s"
TK_FWD_D128_CONSUMERS=3 timeout 150 python -m pytest -x -q tests/test_attention_gpu.py -k "sm90 and d128 and full" 2>&1 | tail -4
echo "tests $((SECONDS-S))s"
for v in 2 3 2 3; do echo "== consumers $v"; TK_FWD_D128_CONSUMERS=$v PYTHONPATH=$PWD/python timeout 60 python scripts/sustained.py --attention 8,16,6144,128 4,16,12288,128 --seconds 2 --rounds 1 2>&1 | grep -v Warn; done
echo "done $((SECONDS-S))s"
