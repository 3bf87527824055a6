"""Token-ID BLEU equals NLTK sentence_bleu; batched edit distance / WER equal rapidfuzz, jiwer."""
import random
import warnings

import jiwer
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rapidfuzz.distance import Levenshtein

from rewards.vectorized import edit_distance, pad_batch, token_bleu, token_wer

nltk_bleu = pytest.importorskip("nltk.translate.bleu_score")
METHOD1 = nltk_bleu.SmoothingFunction().method1


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # These batches are tiny: one thread is faster, and it spares the test from OpenMP
    # spin-waits on a loaded CI machine (measured: 2 ms a call on 1 thread, 40+ ms on 2).
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _pairs(n, seed, vocab=8, max_len=20, min_len=0):
    rng = random.Random(seed)

    def seq():
        return [rng.randint(1, vocab) for _ in range(rng.randint(min_len, max_len))]

    return [seq() for _ in range(n)], [seq() for _ in range(n)]


def _nltk(refs, hyp, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # method0 warns about zero counts
        return nltk_bleu.sentence_bleu(refs, hyp, **kw)


@pytest.mark.parametrize("dictionary", ["rows", "prefix"])
def test_token_bleu_equals_nltk_method1(dictionary):
    cands, refs = _pairs(500, 0)
    cands[:40] = refs[:40]  # perfect matches
    cands[40:60] = [r[:3] for r in refs[40:60]]  # short candidates: brevity penalty, n > len
    got = token_bleu(cands, refs, dictionary=dictionary).tolist()
    expected = [_nltk([r], c, smoothing_function=METHOD1) for c, r in zip(cands, refs)]
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert len({round(x, 6) for x in got}) > 50  # a varied sample, not all zeros


def test_token_bleu_no_smoothing_and_custom_weights_equal_nltk():
    cands, refs = _pairs(200, 1, vocab=5)
    got = token_bleu(cands, refs, smoothing="none").tolist()
    assert got == pytest.approx([_nltk([r], c) for c, r in zip(cands, refs)], rel=1e-12, abs=1e-300)
    got = token_bleu(cands, refs, weights=(0.5, 0.5), max_n=2).tolist()
    expected = [_nltk([r], c, weights=(0.5, 0.5), smoothing_function=METHOD1)
                for c, r in zip(cands, refs)]
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("dictionary", ["rows", "prefix"])
def test_token_bleu_multiple_references_equal_nltk(dictionary):
    rng = random.Random(2)
    cands, _ = _pairs(200, 3, vocab=6)
    refs = [[[rng.randint(1, 6) for _ in range(rng.randint(0, 20))]
             for _ in range(rng.randint(1, 3))] for _ in cands]
    got = token_bleu(cands, refs, dictionary=dictionary).tolist()
    expected = [_nltk(r, c, smoothing_function=METHOD1) for c, r in zip(cands, refs)]
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_token_bleu_padded_tensor_input_matches_lists():
    cands, refs = _pairs(64, 4, min_len=1)
    cand_t, cand_len = pad_batch(cands, pad_id=0)
    ref_t, ref_len = pad_batch(refs, pad_id=0)
    from_lengths = token_bleu(cand_t, ref_t, cand_lengths=cand_len, ref_lengths=ref_len)
    from_pad_id = token_bleu(cand_t, ref_t)  # rows end at the first pad (0)
    assert torch.equal(from_lengths, token_bleu(cands, refs))
    assert torch.equal(from_pad_id, from_lengths)
    stacked = token_bleu(cand_t, ref_t[:, None, :], ref_lengths=ref_len[:, None])  # [B, R=1, L]
    assert torch.equal(stacked, from_lengths)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(1, 4), max_size=12),
                          st.lists(st.integers(1, 4), max_size=12)), min_size=1, max_size=6))
def test_token_bleu_property_equals_nltk(pairs):
    cands, refs = [c for c, _ in pairs], [r for _, r in pairs]
    expected = [_nltk([r], c, smoothing_function=METHOD1) for c, r in pairs]
    for dictionary in ("rows", "prefix"):
        got = token_bleu(cands, refs, dictionary=dictionary).tolist()
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_token_bleu_negative_pad_and_large_vocab():
    cands, refs = _pairs(50, 8, vocab=150_000, min_len=1)
    cand_t, cand_len = pad_batch(cands, pad_id=-100)
    ref_t, ref_len = pad_batch(refs, pad_id=-100)
    got = token_bleu(cand_t, ref_t, pad_id=-100)  # lengths from the first -100
    assert torch.equal(got, token_bleu(cands, refs))
    assert torch.equal(got, token_bleu(cand_t, ref_t, cand_lengths=cand_len, ref_lengths=ref_len,
                                       dictionary="rows"))


def test_edit_distance_and_wer_equal_rapidfuzz_and_jiwer():
    hyps, refs = _pairs(500, 5, vocab=6, max_len=25)
    hyps[:20] = refs[:20]
    got = edit_distance(hyps, refs).tolist()
    assert got == [Levenshtein.distance(h, r) for h, r in zip(hyps, refs)]
    words = lambda seq: " ".join(f"w{t}" for t in seq)  # noqa: E731  same tokens, as text
    wer = token_wer(hyps, refs).tolist()
    assert wer == [jiwer.wer(words(r), words(h)) for h, r in zip(hyps, refs)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(1, 3), max_size=10),
                          st.lists(st.integers(1, 3), max_size=10)), min_size=1, max_size=6))
def test_edit_distance_property(pairs):
    got = edit_distance([h for h, _ in pairs], [r for _, r in pairs]).tolist()
    assert got == [Levenshtein.distance(h, r) for h, r in pairs]


@pytest.mark.parametrize("dictionary", ["rows", "prefix"])
def test_token_bleu_batches_shorter_than_the_ngram_order(dictionary):
    for cands, refs in [([[1], [2, 1]], [[1, 2, 3, 4, 5], [2, 1]]),
                        ([[1, 2, 3, 4, 5], [3]], [[1, 2], [3]]),
                        ([[]], [[]]), ([[1, 2]], [[]])]:
        expected = [_nltk([r], c, smoothing_function=METHOD1) for c, r in zip(cands, refs)]
        got = token_bleu(cands, refs, dictionary=dictionary).tolist()
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-15), (cands, refs)


def test_edit_distance_long_sequences_use_the_dp_and_agree():
    # Shorter side > 62 tokens: no bit-parallel pattern fits, the row DP runs (mixed batch).
    hyps, refs = _pairs(40, 9, vocab=5, max_len=150, min_len=63)
    short_h, short_r = _pairs(40, 10, vocab=5, max_len=70)
    hyps, refs = hyps + short_h + [[1] * 200], refs + short_r + [[1, 2] * 40]
    got = edit_distance(hyps, refs).tolist()
    assert got == [Levenshtein.distance(h, r) for h, r in zip(hyps, refs)]


def test_vectorized_on_empty_and_single_token_sequences():
    assert edit_distance([[], []], [[], []]).tolist() == [0, 0]
    assert edit_distance([[], [1], []], [[1, 2], [], []]).tolist() == [2, 1, 0]
    assert token_wer([[], [1, 2]], [[1], []]).tolist() == [1.0, 2.0]  # jiwer: empty ref -> #ins
    # One matching token: p1 = 1, p2..p4 floored to 0.1 -> 0.1 ** 0.75, as NLTK method1.
    assert token_bleu([[], [1]], [[1, 2], [1]]).tolist() == pytest.approx(
        [0.0, 0.1 ** 0.75], rel=1e-12)
    assert _nltk([[1]], [1], smoothing_function=METHOD1) == pytest.approx(0.1 ** 0.75, rel=1e-12)
