"""The equivalence check shared by export and import: logits and greedy generation, normlab vs ``transformers``.

``compare_models(nl, hf, tokens, context)`` (fp32, real tokens):

- ``max_abs_logit_diff``: max |nl(x) - hf(x)| over ``LOGIT_WINDOWS`` windows ``x [LOGIT_WINDOWS, context]`` spread
  evenly over ``tokens``;
- ``greedy_equal``: ``GREEDY_NEW`` tokens of greedy decoding after a ``GREEDY_PROMPT``-token prompt (the start of
  ``tokens``): normlab's full-forward argmax loop vs HF ``generate(do_sample=False)`` (its KV-cache path).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from normlab.errors import NormlabError

LOGIT_TOL = 1e-4
LOGIT_WINDOWS = 4
GREEDY_PROMPT = 8
GREEDY_NEW = 24


def require_transformers():
    """Import ``transformers`` or raise a one-line error naming the extra that installs it."""
    try:
        import transformers
    except ImportError:
        raise NormlabError("HF interop needs the 'transformers' package: pip install 'normlab[interop]'") from None
    transformers.utils.logging.set_verbosity_error()  # no load/save progress bars or advisory warnings
    transformers.utils.logging.disable_progress_bar()
    return transformers


def hf_logits(hf: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return hf(input_ids=x, use_cache=False).logits


@torch.no_grad()
def compare_models(nl: torch.nn.Module, hf: torch.nn.Module, tokens: np.ndarray, context: int) -> dict:
    nl.eval(), hf.eval()
    n = len(tokens)
    if n < 2:
        raise NormlabError(f"the validation split has {n} token(s); the check needs at least 2")
    L = min(context, n)
    starts = np.linspace(0, n - L, LOGIT_WINDOWS).astype(np.int64)
    x = torch.from_numpy(np.stack([tokens[s : s + L].astype(np.int64) for s in starts]))
    diff = (nl(x).float() - hf_logits(hf, x).float()).abs().max().item()
    diff = float("inf") if math.isnan(diff) else diff
    p = min(GREEDY_PROMPT, L - 1) or 1
    new = max(1, min(GREEDY_NEW, context - p))
    prompt = torch.from_numpy(tokens[:p].astype(np.int64))[None]
    seq = prompt
    for _ in range(new):
        seq = torch.cat([seq, nl(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    gen = hf.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                      min_new_tokens=new, do_sample=False, pad_token_id=0)
    equal = gen.shape == seq.shape and bool(torch.equal(gen, seq))
    return {"max_abs_logit_diff": diff, "logit_windows": [LOGIT_WINDOWS, L], "greedy_equal": equal,
            "greedy_tokens": new, "greedy_prompt_tokens": p}
