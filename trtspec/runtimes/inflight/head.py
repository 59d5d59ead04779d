"""The target's vocabulary head applied on demand: verification computes logits only where they can be used.

A verification pass feeds K + 1 tokens, but the logits at position j matter only if the draft's tokens before j were
all accepted. On a CPU the head is a large part of a step (SmolLM2-135M: 576 x 49152, about a fifth of the model's
multiply-adds per token), so evaluating it for K + 1 positions made verification cost ~1.5 target steps at K = 4.
The decoder asks the body for hidden states and this head for the logits of the rows still undecided at each
position, in order: with acceptance a, about (1 - a^(K+1)) / (1 - a) positions instead of K + 1, and the same
logits (the same ``lm_head`` on the same hidden state) as a full forward pass. (With two or more speculating
sequences in a step, ``acceptance.decide`` applies it once over every row instead: one read of its weights.)

Only model classes whose ``forward`` is exactly ``lm_head(model(...).last_hidden_state)`` qualify (no logit scaling
or soft-capping); for any other model the decoder computes full logits as before.
"""

from __future__ import annotations

from typing import Any

import torch

# transformers classes whose logits are lm_head(last_hidden_state) and nothing else
PLAIN_HEAD_CLASSES = frozenset(
    {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM"}
)


def lazy_head(model: Any) -> Any | None:
    """``model``'s lm_head when logits can be computed from the body's hidden states on demand, else None."""
    if type(model).__name__ not in PLAIN_HEAD_CLASSES:
        return None
    config = getattr(model, "config", None)
    for scaled in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(config, scaled, None) not in (None, 1, 1.0):
            return None
    head, body = getattr(model, "lm_head", None), getattr(model, "model", None)
    if not isinstance(head, torch.nn.Module) or body is None:
        return None
    return head
