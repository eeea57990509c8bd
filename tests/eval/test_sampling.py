"""Sampling filters against hand-computed kept sets (top-k; top-p: Holtzman et al. 2020; min-p: Nguyen et al. 2024;
top-nσ: Tang et al. 2024), sampled frequencies against the filtered distribution, and the generation loop's
sliding window and cache path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from normlab.errors import NormlabError
from normlab.eval.sampling import (
    filter_logits,
    generate_tokens,
    min_p_filter,
    sample_next,
    top_k_filter,
    top_nsigma_filter,
    top_p_filter,
)


pytestmark = pytest.mark.usefixtures("one_thread")


def kept(filtered: torch.Tensor) -> set[int]:
    assert filtered.ndim == 2 and filtered.size(0) == 1
    return {int(i) for i in torch.nonzero(torch.isfinite(filtered[0])).flatten()}


def logp(*probs: float) -> torch.Tensor:
    return torch.log(torch.tensor([probs], dtype=torch.float32))


def test_top_k_hand_examples():
    x = torch.tensor([[1.0, 3.0, 2.0, 5.0, 4.0]])
    assert kept(top_k_filter(x, 2)) == {3, 4}
    assert kept(top_k_filter(x, 1)) == {3}
    assert kept(top_k_filter(x, 5)) == kept(top_k_filter(x, 50)) == {0, 1, 2, 3, 4}
    assert kept(top_k_filter(torch.tensor([[2.0, 2.0, 0.0]]), 1)) == {0, 1}  # ties with the k-th value are kept
    out = top_k_filter(x, 2)
    assert out[0, 3] == 5.0 and out[0, 4] == 4.0  # kept logits unchanged


@pytest.mark.parametrize("p, expect", [(0.1, {1}), (0.6, {1, 3}), (0.85, {0, 1, 3}), (0.96, {0, 1, 2, 3}),
                                       (1.0, {0, 1, 2, 3})])
def test_top_p_hand_examples(p, expect):
    # probs by index: 0.15, 0.50, 0.05, 0.30 -> sorted 0.5 (1), 0.3 (3), 0.15 (0), 0.05 (2); cumulative .5 .8 .95 1
    assert kept(top_p_filter(logp(0.15, 0.50, 0.05, 0.30), p)) == expect


@pytest.mark.parametrize("m, expect", [(0.0, {0, 1, 2, 3}), (0.25, {0, 1, 3}), (0.5, {1, 3}), (0.7, {1}),
                                       (1.0, {1})])
def test_min_p_hand_examples(m, expect):
    # p_max = 0.5: thresholds 0.125, 0.25, 0.35, 0.5
    assert kept(min_p_filter(logp(0.15, 0.50, 0.05, 0.30), m)) == expect


@pytest.mark.parametrize("n, expect", [(1.0, {4}), (2.0, {3, 4}), (2.5, {1, 2, 3, 4}), (3.0, {0, 1, 2, 3, 4})])
def test_top_nsigma_hand_examples(n, expect):
    # logits 0 1 2 3 10: mean 3.2, sum of squared deviations 62.8, unbiased std sqrt(62.8 / 4) = 3.9623
    # thresholds 10 - n * 3.9623: n=1 6.04, n=2 2.08, n=2.5 0.094, n=3 -1.89
    # (the biased std 3.5440 would give {2, 3, 4} at n = 2.5: this case pins the unbiased estimator)
    x = torch.tensor([[0.0, 1.0, 2.0, 3.0, 10.0]])
    assert kept(top_nsigma_filter(x, n)) == expect
    # the kept set does not depend on the temperature (max and std scale together)
    assert kept(filter_logits(x, temperature=0.3, top_nsigma=n)) == expect
    assert kept(filter_logits(x, temperature=3.0, top_nsigma=n)) == expect


def test_filters_rowwise_on_batches():
    x = torch.tensor([[1.0, 3.0, 2.0], [3.0, 1.0, 2.0]])
    out = top_k_filter(x, 1)
    assert torch.isfinite(out).tolist() == [[False, True, False], [True, False, False]]


def test_greedy_and_bad_args():
    x = torch.tensor([[0.1, 2.0, -1.0], [5.0, 0.0, 0.0]])
    assert sample_next(x, temperature=0).tolist() == [1, 0]
    for kw, frag in [({"temperature": -1}, "--temperature"), ({"top_k": 0}, "--top-k"), ({"top_p": 0.0}, "--top-p"),
                     ({"top_p": 1.5}, "--top-p"), ({"min_p": -0.1}, "--min-p"), ({"top_nsigma": 0.0}, "--top-nsigma")]:
        with pytest.raises(NormlabError, match=frag):
            sample_next(x, **kw)



def test_a_temperature_that_overflows_the_logits_is_one_line():
    """Logits divided by a tiny temperature reach +inf in float32 (softmax then NaN, a torch RuntimeError inside
    multinomial before): one NormlabError naming --temperature. Where no logit overflows (2 / 1e-38 = 2e38 is below
    float32's 3.4e38; -100 / 1e-38 is -inf, probability 0) sampling still works and, the limit of T -> 0, is greedy."""
    x = torch.tensor([[2.0, -100.0, 1.0]])
    for t in (1e-320, 1e-45, 1e-39):
        with pytest.raises(NormlabError, match=r"^--temperature .* too small .* use 0 for greedy"):
            sample_next(x, temperature=t)
    assert sample_next(x.expand(50, -1), temperature=1e-38, generator=torch.Generator().manual_seed(0)).tolist() \
        == [0] * 50
    assert filter_logits(x, temperature=1e-38)[0, 1].item() == float("-inf")

def _check_frequencies(logits: torch.Tensor, expected: np.ndarray, n: int = 20000, **kw):
    gen = torch.Generator().manual_seed(1234)
    ids = sample_next(logits.expand(n, -1), generator=gen, **kw)
    freq = np.bincount(ids.numpy(), minlength=len(expected)) / n
    assert np.all(freq[expected == 0] == 0), freq  # filtered tokens are never sampled
    sigma = np.sqrt(expected * (1 - expected) / n)
    assert np.all(np.abs(freq - expected) <= 5 * sigma + 1e-12), (freq, expected)


def test_sampled_frequencies_match_filtered_distribution():
    p = np.array([0.25, 0.05, 0.4, 0.1, 0.2])
    x = torch.log(torch.tensor(p, dtype=torch.float32))[None]
    # temperature 0.7: q ∝ p^(1/0.7) = .138 .0139 .270 .0373 .100 -> q sorted .483 .246 .179 .067 .025;
    # top-p 0.8 keeps the first three (cumulative before them 0, .483, .729 < .8), i.e. ids 2, 0, 4
    q = p ** (1 / 0.7)
    q /= q.sum()
    want = np.where(np.isin(np.arange(5), [0, 2, 4]), q, 0.0)
    _check_frequencies(x, want / want.sum(), temperature=0.7, top_p=0.8)
    # top-k 2 keeps ids 2 (.4) and 0 (.25); min-p 0.7 on what is left: .25 < 0.7 * .4 = .28 -> only id 2
    _check_frequencies(x, np.array([0, 0, 1.0, 0, 0]), top_k=2, min_p=0.7)
    # top-k 3 alone at temperature 1: ids 2, 0, 4 renormalised
    want = np.where(np.isin(np.arange(5), [0, 2, 4]), p, 0.0)
    _check_frequencies(x, want / want.sum(), top_k=3)
    # top-nσ n=1 on logits 0 1 2 3 4 (std 1.5811): threshold 2.42 keeps ids 3, 4 with p ∝ e^3, e^4
    y = torch.arange(5, dtype=torch.float32)[None]
    e = np.exp([3.0, 4.0])
    _check_frequencies(y, np.array([0, 0, 0, e[0], e[1]]) / e.sum(), top_nsigma=1.0)


class SumModel(torch.nn.Module):
    """Toy causal LM: the logit of token ``(sum of the window's tokens so far) % V`` is 1, others 0. Its answer
    depends on every token in the window, so any window mistake changes the greedy tokens. Records input lengths."""

    def __init__(self, vocab: int = 7, with_cache: bool = False):
        super().__init__()
        self.vocab, self.lengths = vocab, []
        if with_cache:
            self.init_state = lambda batch_size: []
            self.step = self._step

    def _logits(self, seq: list[int], t: int) -> torch.Tensor:
        out = torch.zeros(1, t, self.vocab)
        for i in range(t):
            out[0, i, sum(seq[: len(seq) - t + i + 1]) % self.vocab] = 1.0
        return out

    def forward(self, idx):
        self.lengths.append(idx.size(1))
        seq = idx[0].tolist()
        return self._logits(seq, len(seq))

    def _step(self, idx, state):  # the cached state is the whole token history (no window limit of its own)
        state = state + idx[0].tolist()
        return self._logits(state, idx.size(1)), state


def reference_greedy(prompt, n, context, vocab=7):
    seq = list(prompt)
    for _ in range(n):
        seq.append(sum(seq[-context:]) % vocab)
    return seq[len(prompt):]


def test_generate_fallback_crops_to_context():
    m = SumModel()
    out = list(generate_tokens(m, [1, 2, 3], 12, context=5, temperature=0))
    assert out == reference_greedy([1, 2, 3], 12, 5)
    assert max(m.lengths) == 5 and m.lengths[0] == 3 and len(m.lengths) == 12


def test_generate_cache_path_matches_fallback_past_the_window():
    cached = SumModel(with_cache=True)
    out = list(generate_tokens(cached, [1, 2, 3], 12, context=5, temperature=0))
    assert out == reference_greedy([1, 2, 3], 12, 5)
    assert cached.lengths == []  # never fell back to the full forward
    long_prompt = list(range(9))  # longer than the window: prefill the last 5 only
    assert list(generate_tokens(SumModel(with_cache=True), long_prompt, 6, context=5, temperature=0)) == \
        reference_greedy(long_prompt, 6, 5)


def test_generate_seeded_is_reproducible():
    from normlab.model import build_model
    from normlab.model.config import ModelConfig

    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=32, context=16, width=32, depth=1, heads=2)).eval()

    def run(seed):
        return list(generate_tokens(model, [1, 2, 3], 10, context=16, use_cache=False, top_p=0.9,
                                    generator=torch.Generator().manual_seed(seed)))

    assert run(5) == run(5)
    with pytest.raises(NormlabError, match="prompt"):
        list(generate_tokens(model, [], 3, context=16))


def _gpt():
    from normlab.model import build_model
    from normlab.model.config import ModelConfig

    torch.manual_seed(0)
    return build_model(ModelConfig(vocab_size=32, context=16, width=32, depth=2, heads=2)).eval()


def test_gpt_cache_path_gives_the_fallback_greedy_tokens():
    model = _gpt()
    prompt = [3, 1, 4, 1, 5]
    a = list(generate_tokens(model, prompt, 30, context=16, use_cache=True, temperature=0))  # crosses the window
    b = list(generate_tokens(model, prompt, 30, context=16, use_cache=False, temperature=0))
    assert a == b
