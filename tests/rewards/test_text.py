"""bleu vs sacrebleu, wer/cer vs jiwer, rouge_l by hand, tiou / tiou_v2, and the text metrics."""
import random

import jiwer
import pytest
import sacrebleu
from hypothesis import given, settings
from hypothesis import strategies as st

from rewards import corpus_bleu, corpus_error_rate, get_reward, temporal_grounding_metrics
from rewards.temporal import parse_segment
from rewards.text import lcs_length

WORDS = "the a cat dog sat on mat quickly , . ! über 猫 don't 42".split()


def _sentences(n, seed):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 15))) for _ in range(n)]


def test_bleu_equals_sacrebleu_sentence_bleu():
    hyps, refs = _sentences(300, 0), _sentences(300, 1)
    refs[:30] = hyps[:30]
    got = get_reward("bleu")([f"<answer>{h}</answer>" for h in hyps], refs)
    expected = [min(sacrebleu.sentence_bleu(h, [r]).score / 100, 1.0) for h, r in zip(hyps, refs)]
    assert got == pytest.approx(expected, abs=1e-12)
    assert 0 < sum(got) < len(got)


def test_bleu_multiple_references_and_empty():
    bleu = get_reward("bleu")
    refs = ["the cat is on the mat", "there is a cat on the mat"]
    got = bleu(["<answer>there is a cat on the mat</answer>", "<answer></answer>"], [refs, refs])
    expected = sacrebleu.sentence_bleu("there is a cat on the mat", refs).score / 100
    assert got[0] == pytest.approx(expected)
    assert got[1] == 0.0


def test_corpus_bleu_equals_sacrebleu():
    hyps, refs = _sentences(50, 2), _sentences(50, 3)
    assert corpus_bleu(hyps, refs) == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score / 100)


def test_wer_without_normalisation_equals_jiwer():
    hyps, refs = _sentences(300, 4), _sentences(300, 5)
    hyps[:20] = refs[:20]
    got = get_reward("wer")([f"<answer>{h}</answer>" for h in hyps], refs, normalize=False)
    assert got == [max(0.0, 1.0 - jiwer.wer(r, h)) for h, r in zip(hyps, refs)]
    got_cer = get_reward("cer")([f"<answer>{h}</answer>" for h in hyps], refs, normalize=False)
    assert got_cer == [max(0.0, 1.0 - jiwer.cer(r, h)) for h, r in zip(hyps, refs)]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab \t.", max_size=12).filter(str.strip),
       st.text(alphabet="ab \t.", max_size=12).filter(str.strip))
def test_wer_unnormalised_equals_jiwer_on_odd_whitespace(hyp, ref):
    got = get_reward("wer")([hyp], [ref], normalize=False)[0]
    assert got == max(0.0, 1.0 - jiwer.wer(ref, hyp))


def test_wer_default_normalisation():
    wer = get_reward("wer")
    assert wer(["<answer>HELLO, world!!</answer>"], ["hello world"]) == [1.0]
    assert wer(["<answer>HELLO, world!!</answer>"], ["hello world"], normalize=False) == [0.0]
    assert wer(["<answer>one two three four</answer>"], ["one two"]) == [0.0]  # WER 1 -> 0
    assert wer(["<answer>...</answer>", "<answer>a</answer>"], ["hello", ""]) == [0.0, 0.0]


@pytest.mark.parametrize("hyp, ref, expected", [
    ("the cat was under the bed", "the cat was found under the bed", 12 / 13),
    ("police killed the gunman", "the gunman kill police", 0.5),  # LCS "the gunman" = 2 of 4/4
    ("The Cat!", "the cat", 1.0),
    ("completely different", "the cat", 0.0),
    ("我爱猫", "我爱狗", 2 / 3),  # CJK: one token per character
])
def test_rouge_l_hand_computed(hyp, ref, expected):
    assert get_reward("rouge_l")([f"<answer>{hyp}</answer>"], [ref]) == [pytest.approx(expected)]


def _lcs_dp(a, b):
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            table[i + 1][j + 1] = (table[i][j] + 1 if x == y
                                   else max(table[i][j + 1], table[i + 1][j]))
    return table[-1][-1]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.integers(0, 4), max_size=40), st.lists(st.integers(0, 4), max_size=40))
def test_bit_parallel_lcs_equals_dp(a, b):
    assert lcs_length(a, b) == _lcs_dp(a, b)


def test_corpus_wer_equals_jiwer():
    hyps, refs = _sentences(40, 6), _sentences(40, 7)
    assert corpus_error_rate(hyps, refs, normalize=False) == jiwer.wer(refs, hyps)
    assert corpus_error_rate(hyps, refs, unit="char", normalize=False) == jiwer.cer(refs, hyps)


@pytest.mark.parametrize("text, expected", [
    ("5 to 15", (5.0, 15.0)), ("5-15", (5.0, 15.0)), ("[5, 15]", (5.0, 15.0)),
    ("from 5.5s to 15.25 seconds", (5.5, 15.25)), ("00:05 - 01:00", (5.0, 60.0)),
    ("1:00:00 to 1:00:30", (3600.0, 3630.0)), ("15 to 5", (15.0, 5.0)),
    ("-3 to 5", None), ("around 5", None), ("", None),
])
def test_parse_segment(text, expected):
    assert parse_segment(text) == expected


def test_tiou_hand_computed():
    tiou = get_reward("tiou")
    answers = ["5 to 15", "0 to 10", "10 to 20", "15 to 5", "garbage", "2.5-7.5", "0 - 40"]
    got = tiou([f"<answer>{a}</answer>" for a in answers], [[0, 10]] * 7)
    assert got == pytest.approx([1 / 3, 1.0, 0.0, 0.0, 0.0, 0.5, 0.25])
    assert tiou(["<answer>0 to 10</answer>"], ["B"]) == [None]


def test_tiou_v2_time_r1():
    tiou_v2 = get_reward("tiou_v2")
    got = tiou_v2(["<answer>5 to 15</answer>", "<answer>0 to 10</answer>",
                   "<answer>0 to 90</answer>", "<answer>5 to 15</answer>"],
                  [[0, 10]] * 4, duration=[100, 100, 50, None])
    assert got == pytest.approx([1 / 3 * 0.95 * 0.95, 1.0, 10 / 90 * 1.0 * 0.0, None])


def test_temporal_metrics():
    metrics = temporal_grounding_metrics(["0 to 10", "5 to 15", "8 to 20", "x"], [[0, 10]] * 4)
    assert metrics == pytest.approx({"R1@0.3": 0.5, "R1@0.5": 0.25, "R1@0.7": 0.25,
                                     "mIoU": (1 + 1 / 3 + 2 / 20) / 4})
