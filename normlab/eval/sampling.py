"""Next-token sampling with truncation filters. Every filter is a pure function ``logits [B, V] -> [B, V]`` that
returns the logits with the dropped tokens set to ``-inf`` (kept ones unchanged).

- top-k (Fan et al. 2018): keep the ``k`` largest logits (ties with the k-th value are kept).
- top-p / nucleus (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration"): keep the smallest set of
  most probable tokens whose cumulative probability is ``>= p``; the most probable token is always kept.
- min-p (Nguyen et al. 2024, "Turning Up the Heat: Min-p Sampling"): keep tokens with ``p_v >= min_p * max_v p_v``.
- top-nσ (Tang et al. 2024, "Top-nσ: Not All Logits Are You Need"; repo Tomorrowdawn/top_nsigma): on the
  temperature-divided logits ``l``, keep ``l_v >= max(l) - n * std(l)``, std over the whole vocabulary and
  unbiased (``torch.std``'s default, correction 1), as in the authors' ``nsigma_truncate`` (their code keeps
  ``l > threshold``; normlab keeps ``>=``, which differs from it only on exact ties). The kept set does not
  depend on the temperature, since max and std scale with it.

``sample_next`` order: divide by temperature -> top-nσ (needs the full, finite vocabulary) -> top-k -> top-p ->
min-p -> sample from the softmax of what is left. ``temperature == 0`` is greedy (argmax; filters are moot).
"""

from __future__ import annotations

import math

import torch

from normlab.errors import NormlabError

NEG_INF = float("-inf")


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` largest logits per row (ties with the k-th largest are kept). ``logits [B, V]``."""
    if k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter: keep the smallest prefix of tokens sorted by probability with cumulative mass ``>= p``
    (a token is kept iff the mass of the tokens strictly before it in that order is ``< p``). ``logits [B, V]``."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits.double(), dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # exclusive cumulative mass; 0 for the top token
    drop_sorted = before >= p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, NEG_INF)


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep tokens with ``p_v >= min_p * p_max``, i.e. ``l_v >= max(l) + log(min_p)``. ``logits [B, V]``."""
    if min_p <= 0.0:
        return logits
    probs = torch.softmax(logits.double(), dim=-1)
    pmax = probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < min_p * pmax, NEG_INF)


def top_nsigma_filter(logits: torch.Tensor, n: float) -> torch.Tensor:
    """Top-nσ (Tang et al. 2024): keep ``l_v >= max(l) - n * std(l)`` with the unbiased std over all ``V`` logits.

    ``logits [B, V]`` must be finite (apply this filter before any other). ``V == 1`` keeps everything.
    """
    if logits.size(-1) < 2:
        return logits
    x = logits.double()
    threshold = x.max(dim=-1, keepdim=True).values - n * x.std(dim=-1, keepdim=True)
    return logits.masked_fill(x < threshold, NEG_INF)


def check_sampling_args(*, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                        min_p: float | None = None, top_nsigma: float | None = None) -> None:
    """One-line NormlabError for out-of-range sampling options (the CLI flag names are used in the messages)."""
    for flag, v in (("--temperature", temperature), ("--top-p", top_p), ("--min-p", min_p),
                    ("--top-nsigma", top_nsigma), ("--top-k", top_k)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or (flag == "--top-k" and not isinstance(v, int))):
            raise NormlabError(f"{flag} must be {'an integer' if flag == '--top-k' else 'a number'}, got "
                               f"{type(v).__name__} {str(v)[:40]!r}")
    if not math.isfinite(temperature) or temperature < 0:
        raise NormlabError(f"--temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise NormlabError(f"--top-k must be an integer >= 1, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise NormlabError(f"--top-p must be in (0, 1], got {top_p}")
    if min_p is not None and not 0.0 <= min_p <= 1.0:
        raise NormlabError(f"--min-p must be in [0, 1], got {min_p}")
    if top_nsigma is not None and (not math.isfinite(top_nsigma) or top_nsigma <= 0):
        raise NormlabError(f"--top-nsigma must be a finite number > 0, got {top_nsigma}")


def filter_logits(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                  top_p: float | None = None, min_p: float | None = None,
                  top_nsigma: float | None = None) -> torch.Tensor:
    """Temperature-divided, filtered logits ``[B, V]`` (float32); ``softmax`` of it is the sampling distribution.

    ``temperature`` must be > 0 here (greedy decoding does not need a distribution).
    """
    check_sampling_args(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, top_nsigma=top_nsigma)
    if temperature == 0:
        raise ValueError("filter_logits needs temperature > 0; temperature 0 is greedy (see sample_next)")
    x = logits.float() / temperature
    if temperature < 1 and bool((torch.isposinf(x) & torch.isfinite(logits)).any()):  # +inf: softmax is NaN
        raise NormlabError(f"--temperature {temperature} is too small for these logits: dividing by it overflows "
                           "float32; use 0 for greedy decoding or a larger temperature")
    if top_nsigma is not None:
        x = top_nsigma_filter(x, top_nsigma)
    if top_k is not None:
        x = top_k_filter(x, top_k)
    if top_p is not None:
        x = top_p_filter(x, top_p)
    if min_p is not None:
        x = min_p_filter(x, min_p)
    return x


def sample_next(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, min_p: float | None = None, top_nsigma: float | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Sample one token per row: ``logits [B, V] -> ids [B]`` (int64). ``temperature == 0``: greedy argmax."""
    check_sampling_args(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, top_nsigma=top_nsigma)
    if temperature == 0:
        return logits.argmax(dim=-1)
    x = filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                      top_nsigma=top_nsigma)
    probs = torch.softmax(x, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate_tokens(model: torch.nn.Module, prompt: list[int], max_new_tokens: int, *, context: int,
                    use_cache: bool | None = None, generator: torch.Generator | None = None, **sampling):
    """Yield ``max_new_tokens`` sampled ids (ints) continuing ``prompt`` (list of ids, non-empty).

    Every prediction sees the last ``context`` tokens (a sliding window). Two paths with the same result:

    - cache (when ``model`` has ``init_state``/``step``: KV cache for softmax attention, recurrent state for linear
      attention): ``state = model.init_state(1)``; ``logits [1, t, V], state = model.step(idx [1, t], state)``.
      The prompt window is prefilled once, then one token per step; once the window is full, each new token
      re-prefills the last ``context`` tokens (the same window the fallback sees).
    - fallback: the full forward ``model(idx [1, <=context])`` for every new token.

    ``use_cache`` None = cache when available. ``sampling``: the ``sample_next`` keywords.
    """
    if not prompt:
        raise NormlabError("the prompt encodes to no tokens; give a non-empty --prompt")
    check_sampling_args(**sampling)
    cached = hasattr(model, "step") and hasattr(model, "init_state") if use_cache is None else use_cache
    seq = list(prompt)

    def window() -> torch.Tensor:
        return torch.tensor([seq[-context:]], dtype=torch.long)

    state, filled = None, 0
    if cached:
        state = model.init_state(1)
        logits, state = model.step(window(), state)
        filled = min(len(seq), context)
    else:
        logits = model(window())
    for i in range(max_new_tokens):
        tok = int(sample_next(logits[:, -1], generator=generator, **sampling)[0])
        seq.append(tok)
        yield tok
        if i == max_new_tokens - 1:
            break
        if not cached:
            logits = model(window())
        elif filled < context:
            logits, state = model.step(torch.tensor([[tok]], dtype=torch.long), state)
            filled += 1
        else:
            state = model.init_state(1)
            logits, state = model.step(window(), state)
