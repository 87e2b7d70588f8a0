"""Training data at the scale drafters need: tens of thousands of real prompts from public
instruction sets, and the target's own answers to each, greedy and at T = 1.

The drafters of chapters 6-9 were first trained on a few hundred thousand tokens from a few dozen
prompt templates, and they learned those templates. This module makes the larger set in two
steps, each one command:

    python -m logitlab.training.corpus prompts --t0 T0_DIR --gsm8k train.jsonl \\
        --self-instruct SELF_INSTRUCT_DIR --exclude question.jsonl --out prompts.jsonl.xz
    python -m logitlab.training.corpus generate --prompts prompts.jsonl.xz --seconds 1800 \\
        --out corpus.pt --tokens answers.npz

``tools/drafter_corpus.sh DIR`` runs both, fetching the sources at recorded commits, and grows
the corpus each time it is run again. The first reads the public sources below (download them
from the addresses in ``SOURCES``) and drops every prompt that shares a run of 12 words with a
Spec-Bench question (``--exclude``: the prompts the drafters are measured on). The second
finishes in minutes on a GPU; on a CPU with AVX512-BF16, in bfloat16, it made 256 tokens a
second over a 47-minute run (the book's two cores, batches of 128 rows; batches of short prompts
ran at 400 to 500, those of the longest prompts far slower). The target
answers every prompt twice, greedily and at T = 1, until its end-of-turn token or ``--max-new``
tokens, recording its top-64 logits at every new position (the rows every trainer reads, see
``logitlab.training.data``). ``--tokens`` also writes the run's answers as token ids alone (about 1
MB per million tokens), from which the rest is recomputed by teacher forcing: ``--resume`` takes
such files, keeps their answers and answers only the other prompts, so that a corpus grows over
several runs, each adding one token file (``--resume-rows`` keeps the rows file written with them
rather than recomputing their logits: on a CPU the recomputation costs minutes per million
tokens). The repository's ``corpus/`` folder holds the token files made so far;
``generate --seconds 0 --resume corpus/*.npz --out rows.pt`` rebuilds their rows.

A prompts file grows the same way, without moving its prompts (token files name them by index):

    python -m logitlab.training.corpus prompts --extend prompts.jsonl.xz \\
        --german /usr/share/doc/debian-handbook/html/de-DE --exclude question.jsonl --out more.jsonl.xz

appends translation prompts made from a German book (Debian's ``debian-handbook`` package), and
``generate --first german`` answers those before the rest.
"""

from __future__ import annotations

import argparse
import json
import lzma
import random
import re
import time
from pathlib import Path

import torch

from ..devices import generator as seeded_generator
from ..devices import model_device
from .data import TEMPLATES, TOPICS, chat, generate_with_logits, length_batches, machine, padded

# Where each source comes from, and its licence (all allow training a model on them).
SOURCES = {
    "t0": ("P3/T0 training prompts, 50k sample of the self-instruct repository "
           "(github.com/yizhongw/self-instruct, data/finetuning/t0_train_50k)", "Apache-2.0"),
    "gsm8k": ("GSM8K training questions (github.com/openai/grade-school-math, "
              "grade_school_math/data/train.jsonl)", "MIT"),
    "self-instruct": ("Self-Instruct seed tasks and user-oriented instructions "
                      "(github.com/yizhongw/self-instruct)", "Apache-2.0"),
    "book": ("the book's own topic templates (logitlab.training.data)", "the book's licence"),
    "german": ("the paragraphs of the German edition of The Debian Administrator's Handbook (Debian package "
               "debian-handbook, /usr/share/doc/debian-handbook/html/de-DE), each as a translation prompt",
               "GPL-2.0+ or CC-BY-SA-3.0"),
    # The prompts most like Spec-Bench's conversation and question answering (stop 73: a corpus
    # without them taught the drafters maths, not conversation).
    "nq": ("Natural Questions' open-domain questions (github.com/google-research-datasets/natural-questions, "
           "nq_open: the development set and EfficientQA's development and test sets), as questions",
           "CC-BY-SA-3.0"),
    "arena": ("Arena-Hard's user prompts from Chatbot Arena (github.com/lm-sys/arena-hard-auto, "
              "data/arena-hard-v0.1/question.jsonl)", "Apache-2.0"),
    "vicuna": ("the Vicuna benchmark's questions (github.com/lm-sys/FastChat, "
               "fastchat/llm_judge/data/vicuna_bench/question.jsonl)", "Apache-2.0"),
    "roleplay": ("GPTeacher's role-play instructions (github.com/teknium1/GPTeacher, "
                 "Roleplay/roleplay-simple-deduped-roleplay-instruct.json), with their inputs", "MIT"),
}
# Spec-Bench's translation task asks in this form (WMT14 German-English); the sentences differ.
TRANSLATE = "Translate German to English: {}"


def read_jsonl(path: Path) -> list[dict]:
    opener = lzma.open if str(path).endswith(".xz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def t0_prompts(folder: Path, per_template: int, rng: random.Random) -> list[str]:
    """Up to ``per_template`` prompts from each P3 template file (answer choices dropped)."""
    texts = []
    for path in sorted(folder.glob("*.jsonl")):
        rows = [r["prompt"].strip() for r in read_jsonl(path)]
        texts += rng.sample(rows, min(per_template, len(rows)))
    return texts


def self_instruct_prompts(folder: Path) -> list[str]:
    """Each instruction with each of its inputs (or alone when it has none)."""
    texts = []
    for rel in ("data/seed_tasks.jsonl", "human_eval/user_oriented_instructions.jsonl"):
        for task in read_jsonl(folder / rel):
            for inst in task.get("instances", [{}]):
                extra = inst.get("input", "").strip()
                texts.append(task["instruction"].strip() + ("\n\n" + extra if extra else ""))
    return texts


def german_prompts(folder: Path, shortest: int = 150, longest: int = 900) -> list[str]:
    """A translation prompt for each paragraph (``<div class="para">``) of the HTML files in
    ``folder`` that is German (more German than English function words; the handbook leaves a
    few paragraphs untranslated) and ``shortest`` to ``longest`` characters long, tags removed."""
    import html

    german = {"der", "die", "das", "und", "ist", "nicht", "werden", "wird", "mit", "auf", "sich", "eine"}
    english = {"the", "and", "is", "not", "are", "with", "to", "of", "this", "that", "be", "an"}
    texts = []
    for path in sorted(folder.glob("*.html")):
        for block in re.findall(r'<div class="para">(.*?)</div>', path.read_text(encoding="utf-8"), re.S):
            text = " ".join(html.unescape(re.sub(r"<[^>]+>", "", block)).split())
            words = re.findall(r"\w+", text.lower())
            if shortest <= len(text) <= longest and sum(w in german for w in words) > sum(w in english for w in words):
                texts.append(TRANSLATE.format(text))
    return texts


def question(text: str) -> str:
    """An open-domain question as a person types it (Natural Questions' are lower case, without
    the question mark): 'who played anna' -> 'Who played anna?'."""
    text = text.strip()
    if not text:
        return ""
    return text[:1].upper() + text[1:] + ("" if text.endswith("?") else "?")


def chat_prompts(nq: list[Path], arena: Path | None, vicuna: Path | None,
                 roleplay: Path | None) -> list[tuple[str, str]]:
    """``(source, text)`` for each conversational prompt of the files given (see ``SOURCES``):
    the first turn of Arena-Hard's and the Vicuna benchmark's questions, each role-play
    instruction with its input, and each Natural Questions question."""
    rows = [("nq", question(r["question"])) for path in nq for r in read_jsonl(path)]
    for source, path in (("arena", arena), ("vicuna", vicuna)):
        rows += [(source, r["turns"][0]["content"] if isinstance(r["turns"][0], dict) else r["turns"][0])
                 for r in (read_jsonl(path) if path else [])]
    for task in json.loads(roleplay.read_text(encoding="utf-8")) if roleplay else []:
        extra = task.get("input", "").strip()
        rows.append(("roleplay", task["instruction"].strip() + ("\n\n" + extra if extra else "")))
    return [(source, text.strip()) for source, text in rows]


def words(text: str) -> str:
    """The text's words, lower case, one space apart: what the benchmark filter compares."""
    return " ".join(re.findall(r"\w+", text.lower()))


def shingles(text: str, n: int = 12) -> set[str]:
    seq = words(text).split()
    return {" ".join(seq[i: i + n]) for i in range(max(len(seq) - n + 1, 0))}


def build_prompts(t0: Path, gsm8k: Path, self_instruct: Path, exclude: Path | None, per_template: int = 60,
                  seed: int = 0) -> list[dict]:
    """``[{"source", "text"}]``, shuffled, without duplicates or any prompt that shares 12
    consecutive words with a turn of ``exclude`` (Spec-Bench's question.jsonl)."""
    rng = random.Random(seed)
    rows = [("t0", t) for t in t0_prompts(t0, per_template, rng)]
    rows += [("gsm8k", r["question"].strip()) for r in read_jsonl(gsm8k)]
    rows += [("self-instruct", t) for t in self_instruct_prompts(self_instruct)]
    rows += [("book", t.format(topic)) for t in TEMPLATES for topic in TOPICS]
    kept = kept_prompts(rows, exclude)
    rng.shuffle(kept)
    return kept


def extended_prompts(old: list[dict], rows: list[tuple[str, str]], exclude: Path | None, seed: int = 0) -> list[dict]:
    """``old`` (a prompts file's rows) followed by the new ``(source, text)`` prompts, shuffled
    among themselves, without the old ones or any that shares 12 words with ``exclude`` (or, if
    shorter, lies within one of its turns): every old prompt keeps its index, so token files made
    from ``old`` still name the right prompts."""
    new = kept_prompts(rows, exclude, {r["text"] for r in old})
    random.Random(seed).shuffle(new)
    return old + new


def kept_prompts(rows: list[tuple[str, str]], exclude: Path | None, seen: set[str] | None = None) -> list[dict]:
    """The rows as ``{"source", "text"}``, without empty texts, duplicates (of each other or of
    ``seen``) and any text that shares 12 consecutive words with a turn of ``exclude``; a text of
    fewer words (a short question) is left out if it lies within a turn, word for word."""
    banned, turns = set(), []
    for q in read_jsonl(exclude) if exclude else []:
        for turn in q["turns"]:
            banned |= shingles(turn)
            turns.append(f" {words(turn)} ")
    seen, kept = set(seen or ()), []
    for source, text in rows:
        if not text or text in seen:
            continue
        grams = shingles(text)
        if grams & banned or (not grams and any(f" {words(text)} " in turn for turn in turns)):
            continue
        seen.add(text)
        kept.append({"source": source, "text": text})
    return kept


def answer_order(sources: list[str], todo: list[int], first: list[str]) -> list[int]:
    """The prompts ``todo`` (indices; ``sources[i]`` names prompt i's source) with those of the
    sources ``first`` at the front, each part in its own order: a short run then answers them."""
    return [i for i in todo if sources[i] in first] + [i for i in todo if sources[i] not in first]


def batches(prompts: list[list[int]], batch: int, max_prompt: int, max_tokens: int | None = None,
            reserve: int = 0):
    """Batches of prompt indices, each prompt twice (greedy, then T = 1), similar lengths
    together so that little of a batch is padding; prompts longer than ``max_prompt`` dropped.
    With ``max_tokens``, a batch's rows times (its longest prompt + ``reserve``, the answer's
    room) stay within it: long prompts come in smaller batches, so that their cache takes no
    more memory than the short ones' (a prompt too long for it still comes, alone)."""
    order = [i for i in range(len(prompts)) if len(prompts[i]) <= max_prompt]
    half, chunk = max(batch // 2, 1), max(batch // 2, 1) * 16
    for c in range(0, len(order), chunk):
        current = []
        for i in sorted(order[c: c + chunk], key=lambda i: len(prompts[i])):  # the longest last
            cost = 2 * (len(current) + 1) * (len(prompts[i]) + reserve)  # the batch's cache with this prompt
            if current and (len(current) == half or (max_tokens is not None and cost > max_tokens)):
                yield current
                current = []
            current.append(i)
        if current:
            yield current


def cut_at_stop(row, stop_ids: set[int]):
    """A generated row up to and including its first stop token (the rest is not the target's
    answer: the loop ran on for the batch's other rows)."""
    tokens, start, topv, topi = row
    new = tokens[start:].tolist()
    end = next((i + 1 for i, t in enumerate(new) if t in stop_ids), len(new))
    return tokens[: start + end], start, topv[:end], topi[:end]


def generate_corpus(model, tok, texts: list[str], seconds: float, batch: int, max_new: int, max_prompt: int,
                    k: int = 64, seed: int = 0, max_tokens: int | None = None, after_batch=None):
    """Rows ``(tokens, new_from, topv, topi)`` of the target's answers, greedy and at T = 1,
    for as many prompts as ``seconds`` allows (in the order given), and the index in ``texts``
    of each row's prompt. ``after_batch(rows, sources)``, if given, sees them after every batch."""
    prompts = [chat(tok, t) for t in texts]
    stop_ids = {tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id}
    gen, rows, sources, start = seeded_generator(model, seed), [], [], time.perf_counter()
    for index in batches(prompts, batch, max_prompt, max_tokens, max_new):
        if time.perf_counter() - start > seconds:
            break
        pairs = [prompts[i] for i in index for _ in (0, 1)]
        temps = [0.0, 1.0] * len(index)
        out = generate_with_logits(model, pairs, temps, max_new, k, gen, stop_ids=stop_ids)
        rows += [cut_at_stop(r, stop_ids) for r in out]
        sources += [i for i in index for _ in (0, 1)]
        made = sum(len(r[2]) for r in rows)
        print(f"  {len(rows)} rows, {made} new tokens, {time.perf_counter() - start:.0f} s", flush=True)
        if after_batch:
            after_batch(rows, sources)
    return rows, sources


def load_tokens(path: Path) -> tuple[list[int], list[list[int]]]:
    """A token file's rows: each row's prompt (an index into the prompts file) and its answer."""
    import numpy as np

    z = np.load(path)
    new, lengths = z["new"].astype(np.int64), z["length"].tolist()  # each z[...] reads the file again
    ends = np.cumsum(lengths).tolist()
    return z["prompt"].tolist(), [new[e - n: e].tolist() for e, n in zip(ends, lengths)]


def load_token_files(paths: list[Path]) -> tuple[list[int], list[list[int]]]:
    """Several token files' rows, one after the other (a corpus grown over several runs), with a
    ValueError if two of them answer the same prompt (the same run given twice)."""
    sources, answers = [], []
    for path in paths:
        s, a = load_tokens(path)
        if set(s) & set(sources):
            raise ValueError(f"--resume {path} answers prompts an earlier --resume file answers: "
                             "give each run's token file once")
        sources, answers = sources + s, answers + a
    return sources, answers


def token_rows(tok, token_files: list[Path], prompts_file: Path) -> list:
    """The rows of the token files as ``(tokens, new_from, None, None)``: each prompt (from the
    prompts file, in its chat template) and its answer, without the target's logits (a trainer
    that needs only the text, as EAGLE's, which records the target's features itself)."""
    texts = [r["text"] for r in read_jsonl(prompts_file)]
    sources, answers = load_token_files(token_files)
    prompts = {i: chat(tok, texts[i]) for i in set(sources)}
    return [(torch.tensor(prompts[i] + a), len(prompts[i]), None, None) for i, a in zip(sources, answers)]


def greedy_rows(tok, token_files: list[Path], prompts_file: Path) -> list:
    """The greedy (T = 0) rows of the token files, as ``(tokens, new_from, None, argmax)`` with
    ``argmax`` the answer as a ``[n, 1]`` column: each token of a greedy answer is the target's most
    likely next token (as the generation computed it, in the dtype the corpus was made in), which is
    all a cross-entropy trainer learns, so it is read from the text with no pass of the target."""
    import numpy as np

    temperatures = np.concatenate([np.load(path)["temperature"] for path in token_files]).tolist()
    rows = token_rows(tok, token_files, prompts_file)
    return [(t, s, None, t[s:, None]) for (t, s, _, _), temp in zip(rows, temperatures, strict=True)
            if temp == 0 and len(t) > s]


def logit_rows(model, tok, token_files: list[Path], prompts_file: Path) -> list:
    """The rows of the token files with the target's top-64 logits at every answer position, from
    one teacher-forced pass: what the trainers that learn the target's distribution read (the
    draft model, the Medusa heads). A GPU makes them for millions of tokens in a minute; a CPU
    at a few hundred tokens a second in float32."""
    return with_logits(model, token_rows(tok, token_files, prompts_file))


def with_logits(model, rows) -> list:
    """Rows read as text (``token_rows``) with the target's top-64 logits at every answer
    position (``teacher_forced_rows``): for a trainer that reads only some of a corpus's rows."""
    return teacher_forced_rows(model, [r[0][: r[1]].tolist() for r in rows], [r[0][r[1]:].tolist() for r in rows])


def add_corpus_arguments(parser, reads: str) -> None:
    """The options that name a corpus (``--corpus`` token files, ``--prompts`` their prompts file)
    for a trainer; ``reads`` says what the trainer takes from it, for the help."""
    parser.add_argument("--corpus", nargs="+", type=Path, help="instead of --data: the token files of a corpus "
                        f"(logitlab.training.corpus, e.g. corpus/*.npz), {reads}")
    parser.add_argument("--prompts", type=Path, help="with --corpus: the prompts file they answer")


def check_corpus_arguments(parser, args) -> None:
    if args.corpus and not args.prompts:
        parser.error("--corpus needs --prompts (the prompts file its token files answer)")


@torch.inference_mode()
def teacher_forced_rows(model, prompts: list[list[int]], answers: list[list[int]], k: int = 64, batch: int = 64):
    """Rows ``(tokens, new_from, topv, topi)`` for answers made earlier (a token file): one pass over
    each prompt and answer records the target's top-``k`` logits at the positions that predict the
    answer, which generating it recorded as it went. Batches of rows of near-equal length (sorted,
    then put back in order) waste little on right padding, which is causal, so harmless."""
    device, rows = model_device(model), [None] * len(prompts)
    for index in length_batches([len(p) + len(a) for p, a in zip(prompts, answers)], batch):
        seqs = [prompts[i] + answers[i] for i in index]
        ids, mask = padded([torch.tensor(s) for s in seqs], device)
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        for j, (i, s) in enumerate(zip(index, seqs)):
            start = len(prompts[i])
            v, top = model.lm_head(hidden[j, start - 1: len(s) - 1]).float().topk(k, dim=-1)
            rows[i] = (torch.tensor(s), start, v.half().cpu(), top.int().cpu())
    return rows


def kept_rows(rows, answers: list[list[int]], path) -> list:
    """``rows`` (a rows file written beside a token file) if they hold exactly the token file's
    ``answers``; a ValueError naming ``path`` if not (a rows file of another run)."""
    if len(rows) != len(answers) or any(r[0][r[1]:].tolist() != a for r, a in zip(rows, answers)):
        raise ValueError(f"--resume-rows {path} does not hold the answers of the --resume token file "
                         f"({len(rows)} rows against {len(answers)}): give the rows file written with it")
    return rows


def save_tokens(rows, sources: list[int], path: Path, **about) -> None:
    """The answers alone, compactly (a few MB for millions of tokens): each row's prompt as an
    index into the prompts file, its temperature, and its new tokens as 16-bit ids."""
    import numpy as np

    new = np.concatenate([r[0][r[1]:].numpy() for r in rows]).astype(np.uint16)  # the vocabulary fits
    part = Path(f"{path}.part")  # written whole, then renamed: a run stopped while writing keeps the last file
    with open(part, "wb") as f:
        np.savez_compressed(f, prompt=np.array(sources, dtype=np.int32), new=new,
                            length=np.array([len(r[0]) - r[1] for r in rows], dtype=np.int32),
                            temperature=np.array([0.0, 1.0] * (len(rows) // 2), dtype=np.float32),
                            about=np.array(json.dumps(about)))
    part.replace(path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prompts", help="gather the prompts from the public sources")
    p.add_argument("--t0", type=Path, help="folder of the P3/T0 per-template .jsonl files")
    p.add_argument("--gsm8k", type=Path, help="GSM8K's train.jsonl")
    p.add_argument("--self-instruct", type=Path, help="a checkout of yizhongw/self-instruct")
    p.add_argument("--extend", type=Path, help="a prompts file made earlier: kept as it is, the sources below "
                   "appended (instead of --t0, --gsm8k and --self-instruct)")
    p.add_argument("--german", type=Path, help="with --extend: the handbook's de-DE HTML folder")
    p.add_argument("--nq", type=Path, nargs="+", default=[], help="with --extend: Natural Questions' nq_open files")
    p.add_argument("--arena", type=Path, help="with --extend: Arena-Hard's question.jsonl")
    p.add_argument("--vicuna", type=Path, help="with --extend: the Vicuna benchmark's question.jsonl")
    p.add_argument("--roleplay", type=Path, help="with --extend: GPTeacher's role-play .json file")
    p.add_argument("--exclude", type=Path, help="Spec-Bench's question.jsonl: none of its prompts is kept")
    p.add_argument("--per-template", type=int, default=60)
    p.add_argument("--out", type=Path, required=True, help="a .jsonl or .jsonl.xz file")
    g = sub.add_parser("generate", help="the target's answers (a GPU makes millions of tokens in minutes)")
    g.add_argument("--prompts", type=Path, required=True)
    g.add_argument("--seconds", type=float, default=1800, help="time budget")
    g.add_argument("--batch", type=int, default=512, help="rows per batch (two per prompt)")
    g.add_argument("--max-new", type=int, default=256)
    # Spec-Bench's summaries and retrieval prompts run 400 to 1,100 tokens: a corpus without long inputs
    # never shows a drafter what the target writes after them.
    g.add_argument("--max-prompt", type=int, default=1280, help="longer prompts (in tokens) are left out")
    g.add_argument("--batch-tokens", type=int, default=262144,
                   help="at most this many rows x (longest prompt + max-new) per batch: long prompts come in "
                   "smaller batches")
    g.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the target's weights while answering (bfloat16: faster on a GPU, near-equal answers)")
    g.add_argument("--device", help="cuda, mps or cpu (default: the best there is)")
    g.add_argument("--out", type=Path, required=True, help="the rows, as a torch file")
    g.add_argument("--tokens", type=Path, help="also this run's answers' token ids alone (not those of --resume), "
                   "as a small .npz file, written after every batch (a run cut short keeps them: go on with --resume)")
    g.add_argument("--resume", type=Path, nargs="+", default=[], help="token files made earlier from the same "
                   "prompts: their answers are kept (their logits recomputed in one pass) and their prompts not "
                   "answered again; with --seconds 0 this only rebuilds the rows file from them")
    g.add_argument("--resume-rows", type=Path, help="with --resume: the rows file (--out) written with those token "
                   "files, in the same order, whose logits are then kept instead of recomputed")
    g.add_argument("--first", default="", help="comma-separated sources whose prompts are answered before the rest")
    args = parser.parse_args(argv)
    if args.command == "prompts":
        gather(args, parser)
    else:
        answer(args)


def gather(args, parser) -> None:
    """``prompts``: write the prompts file."""
    if args.extend:
        if not (args.german or args.nq or args.arena or args.vicuna or args.roleplay):
            parser.error("--extend needs a source to add (--german, --nq, --arena, --vicuna or --roleplay)")
        new = [("german", t) for t in german_prompts(args.german)] if args.german else []
        new += chat_prompts(args.nq, args.arena, args.vicuna, args.roleplay)
        rows = extended_prompts(read_jsonl(args.extend), new, args.exclude)
    elif not (args.t0 and args.gsm8k and args.self_instruct):
        parser.error("prompts needs --t0, --gsm8k and --self-instruct (or --extend)")
    else:
        rows = build_prompts(args.t0, args.gsm8k, args.self_instruct, args.exclude, args.per_template)
    opener = lzma.open if str(args.out).endswith(".xz") else open
    with opener(args.out, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    counts = {s: sum(r["source"] == s for r in rows) for s in SOURCES}
    print(f"{len(rows)} prompts: {counts}")


def answer(args) -> None:
    """``generate``: the target's answers, after any kept from ``--resume``."""
    import logitlab as ll

    model, tok = ll.load("smollm2-135m", device=args.device, dtype=getattr(torch, args.dtype))
    prompt_rows = read_jsonl(args.prompts)
    texts = [r["text"] for r in prompt_rows]
    start, old, old_sources = time.perf_counter(), [], []
    if args.resume:
        old_sources, answers = load_token_files(args.resume)
        if args.resume_rows:
            old = kept_rows(torch.load(args.resume_rows, weights_only=True), answers, args.resume_rows)
            print(f"{len(old)} rows of {args.resume_rows} kept as they are", flush=True)
        else:
            old = teacher_forced_rows(model, [chat(tok, texts[i]) for i in old_sources], answers)
            print(f"{len(old)} rows of {args.resume} recomputed in {time.perf_counter() - start:.0f} s", flush=True)
    done = set(old_sources)
    todo = answer_order([r["source"] for r in prompt_rows], [i for i in range(len(texts)) if i not in done],
                        [f for f in args.first.split(",") if f])
    start = time.perf_counter()  # the generation's own speed, apart from the recomputed rows

    def save(rows, sources):  # this run's token file after every batch: a run cut short keeps what it made
        if args.tokens and rows:
            save_tokens(rows, [todo[i] for i in sources], args.tokens,
                        seconds=round(time.perf_counter() - start), prompts=str(args.prompts), device=machine(model),
                        max_new=args.max_new, resumed=[str(p) for p in args.resume], dtype=args.dtype,
                        max_prompt=args.max_prompt)

    rows, sources = generate_corpus(model, tok, [texts[i] for i in todo], args.seconds, args.batch, args.max_new,
                                    args.max_prompt, max_tokens=args.batch_tokens, after_batch=save)
    seconds, made = time.perf_counter() - start, sum(len(r[2]) for r in rows)
    print(f"{len(rows)} rows, {made} new tokens in {seconds:.0f} s ({made / max(seconds, 1e-9):.0f} tokens/s) "
          f"on {model.device}")
    save(rows, sources)
    rows = old + rows
    if old:
        print(f"{len(rows)} rows and {sum(len(r[2]) for r in rows)} new tokens in all")
    torch.save(rows, args.out)

if __name__ == "__main__":
    main()
