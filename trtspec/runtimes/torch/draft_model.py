"""The distilled draft's training form, as the torch runtime loads it: a small Llama whose vocabulary head scores only
the target's frequent tokens (``trtspec_draft``).

`trtspec distill` trains this class (trtspec.distill.model builds it from a target) and writes a standard checkpoint of
the target's family instead (trtspec.distill.model.to_standard); the runtime applies the frequent head from those
weights (``frequent_head``). The class lives here, next to the loader, because drafts written by older trtspec
versions are directories of this architecture: :func:`register` makes them loadable through ``loading.load_model``.

On a CPU the draft's cost is dominated by its vocabulary head. ``DraftForCausalLM`` keeps the target's input
embeddings (frozen: the lookup is free and any prompt token embeds exactly) and scores only ``head_token_ids``, the
most frequent tokens of the target's outputs (FR-Spec, Zhao et al. 2025). It returns full-vocabulary logits (-inf
outside the subset), so the draft proposes frequent tokens only while the target still verifies over its whole
vocabulary: greedy output stays identical to target-only decoding.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, LlamaConfig
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.llama.modeling_llama import LlamaModel, LlamaPreTrainedModel
from transformers.utils.deprecation import deprecate_kwarg

MODEL_TYPE = "trtspec_draft"


class DraftConfig(LlamaConfig):
    """LlamaConfig plus ``head_vocab_size``: how many token ids the head scores (the rest get -inf)."""

    model_type = MODEL_TYPE
    head_vocab_size: int | None = None


class SubsetHead(nn.Module):
    """Vocabulary head over ``token_ids`` only: ``weight`` [N, hidden] holds their rows (its own, trained)."""

    def __init__(self, hidden_size: int, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, hidden_size))
        # Saved with the weights: which token ids the rows score (ascending), set by the distiller.
        self.register_buffer("token_ids", torch.arange(n, dtype=torch.long), persistent=True)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.weight.T


class DraftForCausalLM(LlamaPreTrainedModel, GenerationMixin):
    """Llama decoder over the target's embeddings; logits over ``head_token_ids``, scattered to the full vocabulary."""

    config_class = DraftConfig
    config: DraftConfig
    _tied_weights_keys: dict[str, str] = {}

    def __init__(self, config: DraftConfig) -> None:
        super().__init__(config)
        self.model = LlamaModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = SubsetHead(config.hidden_size, config.head_vocab_size or config.vocab_size)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, SubsetHead):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
        else:
            super()._init_weights(module)

    @property
    def head_token_ids(self) -> torch.Tensor:
        return self.lm_head.token_ids

    # transformers and trtspec read the vocabulary a model's logits cover from its output embeddings' first
    # dimension (``SpeculativeDecoder`` checks it against the target's): the draft's logits cover the full vocabulary
    # of its input embeddings (tokens outside the head get -inf), so that is what this returns.
    def get_output_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def set_output_embeddings(self, new_embeddings: nn.Module) -> None:
        raise NotImplementedError("the draft's head is a SubsetHead; it cannot be replaced by a full-vocabulary one")

    def subset_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over ``head_token_ids`` only ([..., N]); what training uses."""
        return self.lm_head(hidden)

    def full_logits(self, subset: torch.Tensor) -> torch.Tensor:
        """Scatter subset logits into a full-vocabulary tensor (-inf for tokens the head does not score)."""
        out = subset.new_full((*subset.shape[:-1], self.vocab_size), float("-inf"))
        out[..., self.head_token_ids] = subset
        return out

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """Like LlamaForCausalLM.forward (no loss); ``.logits`` cover the full vocabulary. ``logits_to_keep`` as
        there: an int keeps the last that many positions (0: all), a tensor names the positions (the in-flight
        engine's packed batches)."""
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden = outputs.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        hidden = hidden[:, keep, :]
        logits = self.full_logits(self.subset_logits(hidden))
        return CausalLMOutputWithPast(logits=logits, cache=outputs.cache)


_registered = False


def register() -> None:
    """Make ``trtspec_draft`` directories loadable through AutoConfig / AutoModelForCausalLM (idempotent)."""
    global _registered
    if _registered:
        return
    AutoConfig.register(MODEL_TYPE, DraftConfig, exist_ok=True)
    AutoModelForCausalLM.register(DraftConfig, DraftForCausalLM, exist_ok=True)
    _registered = True
