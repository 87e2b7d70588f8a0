#!/usr/bin/env bash
# The drafters' training corpus (issue 41), from nothing, in one command:
#
#   tools/drafter_corpus.sh DIR [SECONDS [MORE...]]
#
# 1. the public sources, at the commits the corpus was first made from (git; Debian's debian-handbook
#    for the German translation prompts, installed with apt-get where it is missing);
# 2. the prompts file DIR/prompts.jsonl.xz (python -m logitlab.training.corpus prompts), without
#    any prompt that shares 12 words with a Spec-Bench question;
# 3. SECONDS (default 3600) of the target answering them, greedily and at T = 1, in bfloat16
#    (python -m logitlab.training.corpus generate), after the answers already made: the token
#    files in the repository's corpus/ folder and DIR's earlier runs. It writes DIR/runN.pt (the
#    rows every trainer reads, all answers so far with the target's top-64 logits) and
#    DIR/runN.npz (this run's answers alone, token ids: move it into corpus/ to ship it). MORE goes
#    to `generate` as it is, e.g. `--first german` to answer the translation prompts next.
#
# Steps 1 and 2 run only where DIR has no prompts file yet. Where github.com cannot be reached,
# set MIRRORS to a folder of bare mirrors named owner+name/repo (what the search tool's `fetch`
# makes under /work/.mirror): the files the prompts are read from are taken out of the commit
# below one by one (such a mirror may lack a repository's largest files, none of them needed
# here); or put the sources into DIR/src yourself. Run it again to grow the corpus. A run stopped
# early keeps its answers in runN.npz (written after every batch); the next run resumes from it
# and recomputes the logits its rows file lacks. `SECONDS` of 0 only rebuilds the rows file.
# Sources and licences: logitlab.training.corpus.SOURCES.
set -euo pipefail
DIR=${1:?usage: tools/drafter_corpus.sh DIR [SECONDS [MORE...]]}
SECONDS_BUDGET=${2:-3600}
PY=${PYTHON:-python}
REPO=$(cd "$(dirname "$0")/.." && pwd)  # before the cd below: $0 may be relative
mkdir -p "$DIR"
cd "$DIR"

if [ ! -f prompts.jsonl.xz ]; then
    fetch() {  # repository, commit, folder, the paths read from it
        local repo=$1 commit=$2 folder=src/$3 mirror
        shift 3
        [ -d "$folder" ] && return
        mirror=${MIRRORS:+$MIRRORS/${repo/\//+}/repo}
        if [ -z "$mirror" ]; then
            git clone -q "https://github.com/$repo" "$folder"
            git -C "$folder" checkout -q "$commit"
            return
        fi
        # Into a scratch folder first: a run stopped half-way must not leave a folder the next
        # run would take for complete.
        rm -rf "$folder.part"
        git --git-dir="$mirror" ls-tree -r "$commit" -- "$@" | while read -r _ _ blob path; do
            mkdir -p "$folder.part/$(dirname "$path")"
            git --git-dir="$mirror" cat-file blob "$blob" > "$folder.part/$path"
        done
        mv "$folder.part" "$folder"
    }
    fetch yizhongw/self-instruct 0b26ccaa415992100fa32df62d41b994cf928e23 self-instruct \
        data/finetuning/t0_train_50k/data_per_template data/seed_tasks.jsonl human_eval/user_oriented_instructions.jsonl
    fetch openai/grade-school-math 3101c7d5072418e28b9008a6636bde82a006892c grade-school-math \
        grade_school_math/data/train.jsonl
    fetch hemingkx/Spec-Bench fd2c1cd7d2201ef71db4c5f4e455008f017967bf Spec-Bench data/spec_bench/question.jsonl
    HANDBOOK=/usr/share/doc/debian-handbook/html/de-DE
    [ -d "$HANDBOOK" ] || apt-get install -y -q debian-handbook
    EXCLUDE=src/Spec-Bench/data/spec_bench/question.jsonl
    "$PY" -m logitlab.training.corpus prompts --exclude "$EXCLUDE" --out base.jsonl.xz \
        --t0 src/self-instruct/data/finetuning/t0_train_50k/data_per_template \
        --gsm8k src/grade-school-math/grade_school_math/data/train.jsonl --self-instruct src/self-instruct
    "$PY" -m logitlab.training.corpus prompts --extend base.jsonl.xz --german "$HANDBOOK" \
        --exclude "$EXCLUDE" --out german.jsonl.xz
    # Conversational prompts and open questions, like Spec-Bench's conversation and QA tasks.
    fetch google-research-datasets/natural-questions fb26a3073b1fe636c97302890a27b491d6530130 nq \
        nq_open/NQ-open.dev.jsonl nq_open/NQ-open.efficientqa.dev.1.1.jsonl \
        nq_open/NQ-open.efficientqa.test.1.1.no-annotations.jsonl
    fetch lm-sys/arena-hard-auto efc012e192b88024a5203f5a28ec8fc0342946df arena-hard-auto \
        data/arena-hard-v0.1/question.jsonl
    fetch lm-sys/FastChat 0e6d3e4beaab66f4d3f93db72541a4abab8af28d FastChat \
        fastchat/llm_judge/data/vicuna_bench/question.jsonl
    fetch teknium1/GPTeacher 481075123c29854bddb82655badeef6a438f2436 GPTeacher \
        Roleplay/roleplay-simple-deduped-roleplay-instruct.json
    "$PY" -m logitlab.training.corpus prompts --extend german.jsonl.xz --exclude "$EXCLUDE" --out prompts.jsonl.xz \
        --nq src/nq/nq_open/NQ-open.dev.jsonl src/nq/nq_open/NQ-open.efficientqa.dev.1.1.jsonl \
        src/nq/nq_open/NQ-open.efficientqa.test.1.1.no-annotations.jsonl \
        --arena src/arena-hard-auto/data/arena-hard-v0.1/question.jsonl \
        --vicuna src/FastChat/fastchat/llm_judge/data/vicuna_bench/question.jsonl \
        --roleplay src/GPTeacher/Roleplay/roleplay-simple-deduped-roleplay-instruct.json
fi

# (|| true: a new DIR has no runs yet, and ls's failure must not stop the script under pipefail)
last=$(ls run*.npz 2>/dev/null | sed 's/run\([0-9]*\)\.npz/\1/' | sort -n | tail -1 || true)
next=$(( ${last:-0} + 1 ))
made=()  # the answers already made, in the order every rows file lists them
for f in "$REPO"/corpus/*.npz; do [ -f "$f" ] && made+=("$f"); done
for n in $(seq 1 "${last:-0}"); do [ -f "run$n.npz" ] && made+=("run$n.npz"); done
resume=()
[ ${#made[@]} -gt 0 ] && resume=(--resume "${made[@]}")
# The last rows file holds every answer made before it: its logits need no recomputing.
[ -n "$last" ] && [ -f "run$last.pt" ] && resume+=(--resume-rows "run$last.pt")
"$PY" -m logitlab.training.corpus generate --prompts prompts.jsonl.xz --seconds "$SECONDS_BUDGET" \
    --batch 128 --dtype bfloat16 --out "run$next.pt" --tokens "run$next.npz" "${resume[@]}" "${@:3}"
