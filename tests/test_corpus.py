"""The drafters' training corpus (logitlab.training.corpus) and the pieces of the trainers it
relies on: prompts gathered without the benchmark's, batches, rows cut at the end of the answer,
the compact token file, the held-out split by prompt, and a training time budget."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_speculative import tiny_llama

from logitlab.training.corpus import (answer_order, batches, build_prompts, cut_at_stop, extended_prompts, kept_rows,
                                      chat_prompts, kept_prompts,
                                      german_prompts, greedy_rows, load_token_files, load_tokens, save_tokens,
                                      shingles, teacher_forced_rows, token_rows)
from logitlab.training.data import (choose_vocabulary, generate_with_logits, length_batches, return_freed_memory,
                                    split_held_out, steps_within)
from logitlab.training.draft import held_out as held_out_rows
from logitlab.training.draft import train as train_draft
from logitlab.training.medusa import hidden_states, training_tensors, with_top_logits


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_build_prompts_drops_duplicates_and_every_prompt_the_benchmark_shares(tmp_path):
    t0 = tmp_path / "t0"
    t0.mkdir()
    shared = "one two three four five six seven eight nine ten eleven twelve"
    write_jsonl(t0 / "a.jsonl", [{"prompt": "Answer: what is " + shared + " thirteen?"}, {"prompt": "Keep me."}])
    write_jsonl(t0 / "b.jsonl", [{"prompt": "Keep me."}])  # a duplicate of a.jsonl's
    gsm = write_jsonl(tmp_path / "gsm.jsonl", [{"question": "How many apples?", "answer": "3"}])
    si = tmp_path / "si"
    (si / "data").mkdir(parents=True)
    (si / "human_eval").mkdir()
    write_jsonl(si / "data/seed_tasks.jsonl", [{"instruction": "Sort", "instances": [{"input": "b a"}, {"input": ""}]}])
    write_jsonl(si / "human_eval/user_oriented_instructions.jsonl", [])
    exclude = write_jsonl(tmp_path / "q.jsonl", [{"turns": [shared.upper() + ", said the benchmark."]}])
    rows = build_prompts(t0, gsm, si, exclude)
    texts = [r["text"] for r in rows]
    assert not any(shared in t for t in texts)
    assert texts.count("Keep me.") == 1
    assert {"How many apples?", "Sort\n\nb a", "Sort"} <= set(texts)
    assert sum(r["source"] == "book" for r in rows) == 300
    # Eleven shared words are not a match: only a run of twelve is.
    assert not shingles("one two three four five six seven eight nine ten eleven") & shingles(shared)


GERMAN = ("Die Datei wird von dem Programm gelesen, und die Einstellungen werden dann auf das System "
          "angewendet, wenn der Dienst neu gestartet wird. Das ist nicht immer sofort der Fall.")


def test_german_paragraphs_become_translation_prompts(tmp_path):
    english = ("This paragraph was left untranslated, and the handbook shows it in English: it is not one of "
               "the German paragraphs that the corpus wants to have.")
    page = (f'<div class="para">\n{GERMAN.replace("Programm", "<code>Programm</code>")}\n</div>'
            f'<div class="para">{english}</div><div class="para">Zu kurz, und nicht die.</div>'
            '<div class="para">Der Wert &bdquo;auto&ldquo; ist die Vorgabe, und er wird von dem Dienst gelesen, '
            'wenn die Datei nicht existiert oder wenn sie leer ist, was selten der Fall ist, sagt das Handbuch.</div>')
    (tmp_path / "a.html").write_text(page, encoding="utf-8")
    (tmp_path / "notes.txt").write_text(f'<div class="para">{GERMAN}</div>')  # not a page
    texts = german_prompts(tmp_path)
    # tags and entities gone, the English and the short paragraph left out
    assert texts == ["Translate German to English: " + GERMAN,
                     "Translate German to English: Der Wert \u201eauto\u201c ist die Vorgabe, und er wird von dem "
                     "Dienst gelesen, wenn die Datei nicht existiert oder wenn sie leer ist, was selten der Fall ist, "
                     "sagt das Handbuch."]


def test_an_extended_prompts_file_keeps_every_old_prompt_where_it_was(tmp_path):
    (tmp_path / "de").mkdir()
    shared = "die Datei wird von dem Programm gelesen und die Einstellungen werden dann auf das"
    other = GERMAN.replace("Datei", "Liste")
    (tmp_path / "de/a.html").write_text("".join(f'<div class="para">{t}</div>' for t in [GERMAN, other, GERMAN]))
    old = [{"source": "t0", "text": "b"}, {"source": "gsm8k", "text": "a"},
           {"source": "german", "text": "Translate German to English: " + other}]  # already there
    new = [("german", t) for t in german_prompts(tmp_path / "de")]
    rows = extended_prompts(old, new, None)
    assert rows[:3] == old and rows[3:] == [{"source": "german", "text": "Translate German to English: " + GERMAN}]
    exclude = write_jsonl(tmp_path / "q.jsonl", [{"turns": [shared.upper()]}])  # twelve of its words
    assert extended_prompts(old, new, exclude) == old


def test_conversational_sources_become_prompts_as_a_person_would_type_them(tmp_path):
    nq = write_jsonl(tmp_path / "nq.jsonl", [{"question": "who played anna in frozen", "answer": ["Kristen Bell"]},
                                              {"question": "Is it a question?"}])
    arena = write_jsonl(tmp_path / "arena.jsonl", [{"turns": [{"content": "Write a haiku. "}, {"content": "More"}]}])
    vicuna = write_jsonl(tmp_path / "vicuna.jsonl", [{"turns": ["How do I sleep better?"]}])
    roleplay = tmp_path / "roleplay.json"
    roleplay.write_text(json.dumps([{"instruction": "You are a pirate. ", "input": " Where is the gold?"},
                                    {"instruction": "Greet me as a knight.", "input": ""}]))
    assert chat_prompts([nq], arena, vicuna, roleplay) == [
        ("nq", "Who played anna in frozen?"), ("nq", "Is it a question?"), ("arena", "Write a haiku."),
        ("vicuna", "How do I sleep better?"), ("roleplay", "You are a pirate.\n\nWhere is the gold?"),
        ("roleplay", "Greet me as a knight.")]
    assert chat_prompts([], None, None, None) == []


def test_a_short_prompt_within_a_benchmark_turn_is_left_out(tmp_path):
    # Spec-Bench asks Natural Questions' questions alone and after retrieved passages: too short for
    # a 12-word run, so a short prompt is matched word for word inside each turn.
    turns = ["Who played anna in once upon a time?", "Forests cover a third of the land.\nWhy are forests cut?"]
    exclude = write_jsonl(tmp_path / "q.jsonl", [{"turns": [t]} for t in turns])
    rows = [("nq", "Who played Anna in Once Upon a Time?"), ("nq", "Why are forests cut?"),
            ("nq", "Who played anna?"),  # a part of a turn is left out too: the match errs on the safe side
            ("nq", "Who played elsa in once upon a time?"), ("nq", "Why are forests cut down?")]
    assert [r["text"] for r in kept_prompts(rows, exclude)] == ["Who played elsa in once upon a time?",
                                                                 "Why are forests cut down?"]


def test_the_sources_asked_for_first_are_answered_first():
    sources = ["t0", "german", "gsm8k", "german", "t0"]
    assert answer_order(sources, [0, 1, 2, 3, 4], ["german"]) == [1, 3, 0, 2, 4]
    assert answer_order(sources, [0, 2, 3, 4], ["german", "gsm8k"]) == [2, 3, 0, 4]  # 1 answered already
    assert answer_order(sources, [4, 0], []) == [4, 0]


def test_batches_hold_each_short_prompt_once_and_similar_lengths_together():
    prompts = [[1] * n for n in [5, 50, 3, 40, 4, 500, 41]]
    out = list(batches(prompts, batch=4, max_prompt=100))
    assert sorted(i for b in out for i in b) == [0, 1, 2, 3, 4, 6]  # 500 tokens: left out
    assert all(len(b) <= 2 for b in out)  # two rows per prompt
    assert [sorted(len(prompts[i]) for i in b) for b in out] == [[3, 4], [5, 40], [41, 50]]


def test_length_batches_put_rows_of_near_equal_length_together():
    assert length_batches([5, 2, 9, 2, 7], 2) == [[1, 3], [0, 4], [2]]  # ties keep the rows' order
    assert length_batches([], 4) == []


def test_long_prompts_come_in_batches_whose_cache_fits_the_budget():
    prompts = [[1] * n for n in [10, 10, 10, 10, 60, 60]]
    out = list(batches(prompts, batch=8, max_prompt=100, max_tokens=200, reserve=20))
    # two rows per prompt, each (prompt + 20) slots: three short prompts fit 200, a long one only alone
    assert out == [[0, 1, 2], [3], [4], [5]]
    assert list(batches(prompts, batch=8, max_prompt=100, max_tokens=320, reserve=20)) == [[0, 1, 2, 3], [4, 5]]
    assert list(batches(prompts, batch=8, max_prompt=100)) == [[0, 1, 2, 3], [4, 5]]  # no budget: the batch size alone


def test_a_row_is_cut_after_its_first_stop_token():
    tokens = torch.tensor([7, 8, 1, 2, 9, 3, 9, 4])
    topv, topi = torch.arange(6.0)[:, None], torch.arange(6)[:, None]
    cut, start, v, i = cut_at_stop((tokens, 2, topv, topi), {9})
    assert cut.tolist() == [7, 8, 1, 2, 9] and start == 2 and v.flatten().tolist() == [0, 1, 2]
    assert cut_at_stop((tokens, 2, topv, topi), {5})[0].tolist() == tokens.tolist()  # no stop: all kept


def test_generation_stops_once_every_row_has_stopped():
    model = tiny_llama(2, 0)
    gen = torch.Generator().manual_seed(0)
    rows = generate_with_logits(model, [[1, 2, 3], [4, 5]], [0.0, 0.0], 40, 4, gen)
    first = {r[0][r[1]].item() for r in rows}  # greedy: every row's first token is a stop
    short = generate_with_logits(model, [[1, 2, 3], [4, 5]], [0.0, 0.0], 40, 4, gen, stop_ids=first)
    assert [len(r[2]) for r in rows] == [40, 40] and [len(r[2]) for r in short] == [16, 16]
    for a, b in zip(rows, short):  # the same tokens until it stopped
        assert torch.equal(a[0][: len(b[0])], b[0])


def test_rows_that_stopped_leave_the_batch_without_changing_the_others():
    model = tiny_llama(2, 0, vocab=12)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    full = generate_with_logits(model, prompts, [0.0] * 3, 60, 4, torch.Generator().manual_seed(0))
    # Row 0's 3rd token stops it (it leaves after step 16), the others run on (they stop later or not at all).
    stop = full[0][0][full[0][1] + 2].item()
    short = generate_with_logits(model, prompts, [0.0] * 3, 60, 4, torch.Generator().manual_seed(0), stop_ids={stop})
    for a, b in zip(full, short):
        a, b = cut_at_stop(a, {stop}), cut_at_stop(b, {stop})
        assert torch.equal(a[0], b[0]) and torch.equal(a[3], b[3])
        torch.testing.assert_close(a[2].float(), b[2].float(), atol=2e-3, rtol=0)
    assert len(short[0][2]) == 16 and len(full[0][2]) == 60  # it left at the first check after its stop
    assert any(len(r[2]) > 16 for r in short)


def test_token_file_keeps_each_answer_and_its_prompt(tmp_path):
    rows = [(torch.tensor([5, 6, 49151, 7]), 2, None, None), (torch.tensor([5, 6, 8]), 2, None, None)]
    save_tokens(rows, [3, 3], tmp_path / "t.npz", device="test")
    z = np.load(tmp_path / "t.npz")
    assert z["new"].tolist() == [49151, 7, 8] and z["length"].tolist() == [2, 1]
    assert z["prompt"].tolist() == [3, 3] and z["temperature"].tolist() == [0.0, 1.0]
    assert json.loads(str(z["about"])) == {"device": "test"}


def test_a_resumed_corpus_recomputes_the_logits_generation_recorded(tmp_path):
    model = tiny_llama(2, 0, vocab=12)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    rows = generate_with_logits(model, prompts, [0.0, 1.0, 1.0], 12, 4, torch.Generator().manual_seed(0))
    save_tokens(rows, [0, 1, 2], tmp_path / "t.npz")
    sources, answers = load_tokens(tmp_path / "t.npz")
    assert sources == [0, 1, 2] and answers == [r[0][r[1]:].tolist() for r in rows]
    again = teacher_forced_rows(model, prompts, answers, k=4, batch=2)  # two batches, right padding
    for (tokens, start, v, i), (t2, s2, v2, i2) in zip(rows, again):
        assert torch.equal(tokens, t2) and start == s2 and torch.equal(i, i2)
        torch.testing.assert_close(v.float(), v2.float(), atol=2e-3, rtol=0)


def test_medusa_states_give_the_logits_generation_recorded_in_the_rows_order():
    """The Medusa trainer's one pass over a corpus read as text: states recorded in batches sorted
    by length come back in the rows' order, and the output layer on them gives the top-k logits
    the generation recorded (as teacher_forced_rows does from its own pass)."""
    model = tiny_llama(2, 0, vocab=12)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
    rows = generate_with_logits(model, prompts, [0.0, 1.0, 1.0, 0.0], 70, 4, torch.Generator().manual_seed(1))
    assert len(rows[0][2]) == 70  # more positions than the output layer's 64 at a time
    text = [(tokens, start, None, None) for tokens, start, _, _ in rows]
    states = hidden_states(model, text, batch=3)  # [2, 1, 0] by length, then [3]
    assert [len(h) for h in states] == [len(r[0]) - r[1] for r in rows]
    for (tokens, start, v, i), (t2, s2, v2, i2) in zip(rows, with_top_logits(model, text, states, k=4)):
        assert torch.equal(tokens, t2) and start == s2 and torch.equal(i, i2)
        torch.testing.assert_close(v.float(), v2.float(), atol=2e-3, rtol=0)


def test_a_corpus_grown_over_runs_reads_its_token_files_in_order(tmp_path):
    rows = [(torch.tensor([5, 6, 7]), 2, None, None), (torch.tensor([5, 8]), 1, None, None),
            (torch.tensor([9, 9, 10, 11]), 2, None, None), (torch.tensor([9, 12]), 1, None, None)]
    save_tokens(rows[:2], [4, 4], tmp_path / "a.npz")
    save_tokens(rows[2:], [0, 0], tmp_path / "b.npz")
    sources, answers = load_token_files([tmp_path / "a.npz", tmp_path / "b.npz"])
    assert sources == [4, 4, 0, 0] and answers == [[7], [8], [10, 11], [12]]
    with pytest.raises(ValueError, match="--resume .*a.npz answers prompts an earlier --resume file answers"):
        load_token_files([tmp_path / "a.npz", tmp_path / "a.npz"])


class CharTokenizer:
    """A tokenizer of one id per character, whose chat template is a "<" before the text."""

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return "<" + messages[0]["content"]

    def __call__(self, text, add_special_tokens):
        return SimpleNamespace(input_ids=[ord(c) for c in text])


def test_token_rows_are_each_prompt_in_its_template_and_its_answer(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"source": "t0", "text": "ab"}, {"source": "t0", "text": "c"}])
    rows = [(torch.tensor([60, 99, 7, 8]), 2, None, None), (torch.tensor([60, 99, 9]), 2, None, None)]
    save_tokens(rows, [1, 1], tmp_path / "a.npz")
    save_tokens([(torch.tensor([60, 97, 98, 5]), 3, None, None)] * 2, [0, 0], tmp_path / "b.npz")
    got = token_rows(CharTokenizer(), [tmp_path / "a.npz", tmp_path / "b.npz"], prompts)
    assert [(r[0].tolist(), r[1]) for r in got] == [([60, 99, 7, 8], 2), ([60, 99, 9], 2), ([60, 97, 98, 5], 3),
                                                     ([60, 97, 98, 5], 3)]
    assert all(r[2] is None and r[3] is None for r in got)
    # Without logits, the drafter's vocabulary is the answers' most frequent tokens (5 twice, then 7, 8, 9).
    assert choose_vocabulary(got, 100, 1).tolist() == [5]
    assert choose_vocabulary(got, 100, 4).tolist() == [5, 7, 8, 9]


def test_greedy_rows_are_the_t0_answers_with_each_token_as_the_targets_argmax(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"source": "t0", "text": "ab"}, {"source": "t0", "text": "c"}])
    # Rows come in pairs, greedy then T = 1; an empty greedy answer teaches nothing and is left out.
    save_tokens([(torch.tensor([60, 99, 7, 8]), 2, None, None), (torch.tensor([60, 99, 9]), 2, None, None)],
                [1, 1], tmp_path / "a.npz")
    save_tokens([(torch.tensor([60, 97, 98]), 3, None, None), (torch.tensor([60, 97, 98, 4]), 3, None, None)],
                [0, 0], tmp_path / "b.npz")
    got = greedy_rows(CharTokenizer(), [tmp_path / "a.npz", tmp_path / "b.npz"], prompts)
    assert len(got) == 1
    tokens, start, topv, argmax = got[0]
    assert (tokens.tolist(), start, topv) == ([60, 99, 7, 8], 2, None)
    assert argmax.tolist() == [[7], [8]]
    # The vocabulary counts the answers' tokens (the rows have no logits to weigh them by).
    assert choose_vocabulary(got, 100, 2).tolist() == [7, 8]


def test_subset_cross_entropy_is_over_the_drafted_tokens_at_the_positions_they_can_hit():
    from logitlab.speculative.draft_model import build_draft
    from logitlab.speculative.subset_head import SubsetHead
    from logitlab.training.data import new_token_states
    from logitlab.training.draft import first_guess_accuracy, loss_on

    target = tiny_llama(2, 0, vocab=12)
    target.config.tie_word_embeddings = True
    draft = build_draft(target)
    rows = [(torch.tensor([1, 2, 3, 4, 5]), 2, None, torch.tensor([[3], [4], [5]])),
            (torch.tensor([6, 7, 9]), 1, None, torch.tensor([[7], [9]]))]
    head = SubsetHead(target.model.embed_tokens.weight, torch.tensor([3, 5, 9]))
    with torch.no_grad():
        h = torch.cat(new_token_states(draft.model, rows))  # 5 positions; token 4 and 7 are not drafted from
        logp = torch.log_softmax(h @ target.model.embed_tokens.weight[[3, 5, 9]].T, -1)
        expected = -(logp[0, 0] + logp[2, 1] + logp[4, 2]) / 3  # positions 1 and 3 (targets 4, 7) left out
        torch.testing.assert_close(loss_on(draft, rows, "ce", head), expected)
        full = torch.nn.functional.cross_entropy(draft.lm_head(h), torch.tensor([3, 4, 5, 7, 9]))
        torch.testing.assert_close(loss_on(draft, rows, "ce"), full)
        missed = [(torch.tensor([1, 2]), 1, None, torch.tensor([[4]]))]
        assert loss_on(draft, missed, "ce", head).item() == 0.0  # not NaN
        # Its first guesses are tokens of the subset, scored against every position's target.
        guess = torch.tensor([3, 5, 9])[logp.argmax(-1)]
        expected_hits = (guess == torch.tensor([3, 4, 5, 7, 9])).float().mean().item()
        assert first_guess_accuracy(draft, rows, head=head) == pytest.approx(expected_hits)


def test_a_resumed_corpus_keeps_the_rows_file_of_its_token_file(tmp_path):
    model = tiny_llama(2, 0, vocab=12)
    rows = generate_with_logits(model, [[1, 2, 3], [4, 5]], [0.0, 1.0], 6, 4, torch.Generator().manual_seed(0))
    save_tokens(rows, [0, 1], tmp_path / "t.npz")
    torch.save(rows, tmp_path / "rows.pt")
    _, answers = load_tokens(tmp_path / "t.npz")
    kept = kept_rows(torch.load(tmp_path / "rows.pt", weights_only=True), answers, "rows.pt")
    assert all(torch.equal(a[2], b[2]) and torch.equal(a[0], b[0]) for a, b in zip(kept, rows))
    with pytest.raises(ValueError, match="--resume-rows other.pt does not hold the answers"):
        kept_rows(rows[:1], answers, "other.pt")
    with pytest.raises(ValueError, match="2 rows against 2"):
        kept_rows(rows[::-1], answers, "other.pt")  # the same count, other answers


def test_held_out_split_also_splits_prompts_only_the_data_knows():
    def row(prompt):
        return (torch.tensor(prompt + [99]), len(prompt), None, None)

    listed = [[1], [2], [3]]
    old = [row([1]), row([2]), row([3]), row([1])]
    train, held = split_held_out(old, listed, every=2)  # prompts 1 and 3 held out, as before
    assert [r[0][0].item() for r in held] == [1, 3, 1] and [r[0][0].item() for r in train] == [2]
    new = [row([7]), row([8]), row([7]), row([9])]  # listed + [7, 8, 9]: every second is 1, 3, 8
    train, held = split_held_out(new, listed, every=2)
    assert [r[0][0].item() for r in held] == [8] and [r[0][0].item() for r in train] == [7, 7, 9]
    with pytest.raises(ValueError, match="one prompt in 2 leaves 0 rows to train on and 2"):
        split_held_out([row([1]), row([1])], listed, every=2)  # its only prompt is held out
    with pytest.raises(ValueError, match="leaves 1 rows to train on and 0 to measure"):
        split_held_out([row([2])], listed, every=2)
    with pytest.raises(ValueError, match="held_out_every must be a whole number of at least 1 .*got 0"):
        split_held_out(old, listed, every=0)


def test_draft_training_rejects_a_batch_larger_than_the_data():
    with pytest.raises(ValueError, match="batch must be between 1 and the 2 training rows, got 3"):
        train_draft(None, [0, 1], steps=1, lr=1e-3, batch=3)


def test_steps_within_a_time_budget():
    assert steps_within(None, 500, 20, 10.0) == 500
    assert steps_within(60.0, 500, 20, 10.0) == 120
    assert steps_within(600.0, 500, 20, 10.0) == 500
    assert steps_within(1.0, 500, 20, 10.0) == 20  # never fewer than were run
    # The 5 warm-up steps took 4.5 s, the next 15 took 7.5 s: 2 steps a second after the warm-up.
    assert steps_within(60.0, 500, 20, 12.0, warm=(5, 4.5)) == 5 + int(55.5 * 2)


def test_medusa_targets_skip_rows_shorter_than_the_heads():
    rows = [(torch.arange(6), 4, torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.int32))]
    hidden, sub, probs, target = training_tensors(rows, [torch.zeros(2, 4)], torch.arange(8), 8, num_heads=4)
    assert target.tolist() == [[1, -1], [-1, -1], [-1, -1], [-1, -1]]


SHIPPED = sorted((Path(__file__).parent.parent / "corpus").glob("*.npz"))


@pytest.mark.skipif(not SHIPPED, reason="the repository ships no corpus token file")
def test_the_shipped_corpus_answers_each_prompt_once_greedily_and_at_t1():
    """corpus/*.npz: what the drafters trained on, read as a trainer reads it (corpus/README.md)."""
    sources, answers = load_token_files(SHIPPED)  # also: no prompt answered in two files
    assert len(sources) == len(answers) > 0 and len(sources) % 2 == 0
    assert sources[::2] == sources[1::2] and len(set(sources)) == len(sources) // 2  # a pair per prompt
    assert 0 <= min(sources) and max(sources) < 35626  # indices into the prompts file README.md names
    assert all(1 <= len(a) <= 256 for a in answers)  # cut at the end of turn, or at --max-new
    assert max(max(a) for a in answers) < 49152  # SmolLM2's vocabulary
    im_end = 2  # <|im_end|>: every answer ends its turn, or stops at the cap
    assert all(a[-1] == im_end or len(a) == 256 for a in answers)
    for path in SHIPPED:
        assert np.load(path)["temperature"].tolist()[:4] == [0.0, 1.0, 0.0, 1.0]


def test_draft_medusa_and_pass_trainers_read_a_corpus_and_hold_out_eagles_rows(tmp_path):
    """--corpus for the draft model, the Medusa heads and PaSS's embeddings: the target's logits recomputed, the rows of
    every seventh prompt held out (the rows EAGLE's trainer holds out of the same files), a log beside
    the weights."""
    import logitlab as ll
    from logitlab.training import draft, lookahead, medusa
    from logitlab.training.data import prompt_ids, varied_prompts

    texts = [f"Name {n} animals that live in the sea." for n in range(2, 10)]  # 8 prompts, none the book's
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"source": "t0", "text": t} for t in texts])
    model, tok = ll.load("smollm2-135m", device="cpu")
    answers = [(torch.tensor([1] + list(range(100 + n, 108 + n))), 1, None, None) for n in range(16)]
    save_tokens(answers, [i for i in range(8) for _ in (0, 1)], tmp_path / "a.npz")
    rows = token_rows(tok, [tmp_path / "a.npz"], prompts)
    _, held = split_held_out(rows, varied_prompts(tok) + prompt_ids(tok), 7)
    assert len(held) == 2  # prompt 3: the 344th prompt counted, after the book's 340
    common = ["--corpus", str(tmp_path / "a.npz"), "--prompts", str(prompts), "--device", "cpu", "--steps", "2"]
    draft.main(common + ["--batch", "2", "--vocab", "64", "--held-out-every", "7", "--out", str(tmp_path / "d.safetensors")])
    medusa.main(common + ["--batch", "8", "--out", str(tmp_path / "h.safetensors")])
    for name in ("d", "h"):
        log = json.loads((tmp_path / f"{name}.json").read_text())
        assert (log["rows"], log["held_out_rows"]) == (14, 2) and log["held_out_new_tokens"] == 16
        assert log["recipe"]["corpus"] == [str(tmp_path / "a.npz")]
    log = json.loads((tmp_path / "d.json").read_text())
    assert log["steps_run"] == 2 and len(log["held_out"]["first_guess_accuracy"]) == 2
    assert 0 <= min(log["held_out"]["first_guess_accuracy"]) <= max(log["held_out"]["first_guess_accuracy"]) <= 1
    assert len(json.loads((tmp_path / "h.json").read_text())["held_out_top3"]) == 4  # per head
    # PaSS on a sample of the training rows; only answers longer than k serve (these have 8 tokens).
    lookahead.main(common + ["--k", "7", "--batch", "2", "--groups", "2", "--train-rows", "4",
                             "--out", str(tmp_path / "p.safetensors")])
    log = json.loads((tmp_path / "p.json").read_text())
    assert (log["rows"], log["held_out_rows"], log["held_out_new_tokens"]) == (4, 2, 16)
    assert len(log["held_out_top1"]) == 7 and log["recipe"]["train_rows"] == 4
    assert 0.5 < log["mean_kl_per_slot"][1] / log["mean_kl_per_slot"][0] < 2  # two steps: a mean of two, not of ten
    with pytest.raises(SystemExit):
        lookahead.main(common + ["--k", "8", "--out", str(tmp_path / "p8.safetensors")])
    # Cross-entropy reads the greedy rows alone (each prompt's first), with no pass of the target.
    draft.main(common + ["--loss", "ce", "--batch", "2", "--vocab", "64", "--held-out-every", "7",
                         "--out", str(tmp_path / "c.safetensors")])
    log = json.loads((tmp_path / "c.json").read_text())
    assert (log["rows"], log["held_out_rows"], log["held_out_new_tokens"]) == (7, 1, 8)
    with pytest.raises(SystemExit):
        draft.main(["--corpus", str(tmp_path / "a.npz")])  # no prompts file


def test_the_draft_trainer_holds_out_its_last_rows_without_a_prompt_split():
    rows = [(torch.tensor([1, 2, n]), 2, None, None) for n in range(40)]
    train, held = held_out_rows(rows, None, None)
    assert train == rows[:8] and held == rows[8:]
    with pytest.raises(ValueError, match="last 32 rows leaves none of its 32 to train on"):
        held_out_rows(rows[:32], None, None)


def test_the_trainers_record_with_the_target_itself_or_a_copy_in_the_dtype_asked():
    """EAGLE's and Medusa's --target-dtype: float32 reuses the target (no second load); bfloat16 is
    a second copy, leaving the float32 one the drafter trains against unrounded."""
    import logitlab as ll
    from logitlab.training.data import recording_copy

    model, _ = ll.load("smollm2-135m", device="cpu")
    assert recording_copy(model, "float32") is model
    copy = recording_copy(model, "bfloat16", "cpu")
    assert copy is not model and copy.lm_head.weight.dtype == torch.bfloat16
    assert model.lm_head.weight.dtype == torch.float32


MAPPED_BLOCKS = """
import ctypes, ctypes.util, sys
from logitlab.training.data import return_freed_memory
libc = ctypes.CDLL(ctypes.util.find_library("c"))
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc.mallinfo2.restype, libc.malloc.restype, libc.free.argtypes = MallInfo2, ctypes.c_void_p, [ctypes.c_void_p]
if sys.argv[1] == "set":
    assert return_freed_memory()
mapped = []
for _ in range(3):  # a 1 MB block, made and freed three times
    before = libc.mallinfo2().hblks
    block = libc.malloc(1 << 20)
    mapped.append(libc.mallinfo2().hblks - before)
    libc.free(block)
print(mapped)
"""


def test_return_freed_memory_keeps_glibc_mapping_large_blocks_after_one_is_freed():
    """A 1 MB block is mapped on its own (glibc's mallinfo2 counts such blocks) every time with
    the threshold fixed; left as it is, glibc raises its threshold when the first is freed and
    takes the next two from the heap. Each in a new process, whose heap is in the state a
    trainer's starts in."""
    import ctypes
    import ctypes.util
    import subprocess
    import sys

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if not hasattr(libc, "gnu_get_libc_version"):
        assert return_freed_memory() is False  # macOS, Windows: nothing to set
        pytest.skip("not glibc")
    if not hasattr(libc, "mallinfo2"):
        pytest.skip("glibc 2.33 or later is needed to count the mapped blocks")
    mapped = {how: subprocess.run([sys.executable, "-c", MAPPED_BLOCKS, how], capture_output=True, text=True,
                                  check=True).stdout.strip() for how in ("set", "unset")}
    assert mapped == {"set": "[1, 1, 1]", "unset": "[1, 0, 0]"}
    with pytest.raises(ValueError, match="threshold must be a positive number of bytes"):
        return_freed_memory(0)
