"""The distilled draft while it trains: a small Llama whose vocabulary head scores only the target's frequent tokens.

What `trtspec distill` writes is not this class: :func:`to_standard` turns it into a standard checkpoint of the
target's family (full-vocabulary ``lm_head``: the trained rows at the frequent tokens, zero rows elsewhere, recorded
in config.json), and trtspec's loader applies the frequent head from those weights (``frequent_head``).

On a CPU the draft's cost is dominated by its vocabulary head (FACTS: "the draft's vocabulary head dominates its cost").
``DraftForCausalLM`` keeps the target's input embeddings (frozen: the lookup is free and any prompt token embeds
exactly) and scores only ``head_token_ids``, the most frequent tokens of the target's outputs (FR-Spec, Zhao et al.
2025), with head rows that start as the target's output rows for those tokens and are trained. It returns
full-vocabulary logits (-inf outside the subset), so the draft proposes frequent tokens only while the target still
verifies over its whole vocabulary: greedy output stays identical to target-only decoding.

Registered with transformers' Auto classes as model type ``trtspec_draft`` (:func:`register`), so drafts written by
older trtspec versions still load through ``loading.load_model``.
"""

from __future__ import annotations

from collections.abc import Sequence
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


def draft_config(
    target_config: Any, layers: int, head_tokens: int, intermediate_size: int | None = None
) -> DraftConfig:
    """A draft config with the target's width, attention shape, rope and tokens; ``layers`` deep."""
    d = target_config.to_dict()
    for key in (
        "architectures",
        "model_type",
        "transformers_version",
        "_model_name_or_path",
        "auto_map",
        "quantization_config",
        "head_vocab_size",
    ):
        d.pop(key, None)
    if d.get("layer_types"):
        d["layer_types"] = d["layer_types"][:layers]
    d.update(
        num_hidden_layers=layers,
        head_vocab_size=head_tokens,
        tie_word_embeddings=False,
        intermediate_size=intermediate_size or d["intermediate_size"],
    )
    return DraftConfig(**d)


@torch.no_grad()
def draft_from_target(
    target: Any,
    layer_indices: Sequence[int],
    head_token_ids: torch.Tensor,
    intermediate_size: int | None = None,
    weights: dict[str, torch.Tensor] | None = None,
) -> DraftForCausalLM:
    """A draft initialized from the target: its embeddings (frozen), the decoder layers ``layer_indices``, its final
    norm, and a head over ``head_token_ids`` starting from the target's output rows. A narrower MLP keeps the target's
    strongest channels (largest gate x up x down norms). ``weights`` (the target's tensors by checkpoint name, e.g.
    from :func:`source_weights`) replace the loaded modules' when those are in another dtype or on GPUs: the draft
    must share the target's exact embeddings."""
    cfg = draft_config(target.config, len(layer_indices), int(head_token_ids.numel()), intermediate_size)
    draft = DraftForCausalLM(cfg)
    if weights is None:
        weights = {
            "model.embed_tokens.weight": target.get_input_embeddings().weight,
            "model.norm.weight": target.model.norm.weight,
            "lm_head.weight": target.get_output_embeddings().weight,
        }
        for i in layer_indices:
            weights.update({f"model.layers.{i}.{k}": v for k, v in target.model.layers[i].state_dict().items()})
    embed = weights["model.embed_tokens.weight"]
    draft.model.embed_tokens.weight.copy_(embed)
    draft.model.norm.weight.copy_(weights["model.norm.weight"])
    for dst, i in zip(draft.model.layers, layer_indices):
        prefix = f"model.layers.{i}."
        src = {k[len(prefix) :]: v.float().cpu() for k, v in weights.items() if k.startswith(prefix)}
        if cfg.intermediate_size != target.config.intermediate_size:
            src = _narrow_mlp(src, cfg.intermediate_size)
        dst.load_state_dict(src)
    ids = torch.sort(head_token_ids.long()).values
    draft.lm_head.token_ids.copy_(ids)
    # The head starts as the target's own output rows for these tokens (tied heads: its embedding rows).
    out_rows = weights.get("lm_head.weight", embed)
    draft.lm_head.weight.copy_(out_rows[ids.to(out_rows.device)])
    draft.model.embed_tokens.weight.requires_grad_(False)
    return draft


def source_weights(model_dir: Any, layer_indices: Sequence[int]) -> dict[str, torch.Tensor] | None:
    """The target's tensors a draft starts from, read in float32 from its safetensors files (a few layers of a
    large target, not the whole model); None when it has none (then the loaded model's are used)."""
    from pathlib import Path

    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    wanted = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")
    layers = tuple(f"model.layers.{i}." for i in layer_indices)
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            for name in handle.keys():
                if name in wanted or name.startswith(layers):
                    out[name] = handle.get_tensor(name).float()
    return out if "model.embed_tokens.weight" in out else None


@torch.no_grad()
def to_standard(draft: DraftForCausalLM, target_config: Any) -> Any:
    """The draft as a standard model of the target's family (e.g. LlamaForCausalLM): ``vocab_size`` the target's, a
    full-vocabulary ``lm_head`` whose rows are the trained ones at the head's tokens and zeros elsewhere, and
    ``trtspec_frequent_head`` in its config so that trtspec's loader scores only those rows."""
    from trtspec.engines.torch_runtime.frequent_head import CONFIG_KEY

    d = target_config.to_dict()
    for key in (
        "architectures",
        "transformers_version",
        "_name_or_path",
        "auto_map",
        "quantization_config",
        "head_vocab_size",
        CONFIG_KEY,
    ):
        d.pop(key, None)
    cfg = draft.config
    if d.get("layer_types"):
        d["layer_types"] = d["layer_types"][: cfg.num_hidden_layers]
    d.update(
        num_hidden_layers=cfg.num_hidden_layers, intermediate_size=cfg.intermediate_size, tie_word_embeddings=False
    )
    config = type(target_config).from_dict(d)
    ids = draft.head_token_ids
    setattr(
        config,
        CONFIG_KEY,
        {"tokens": int(ids.numel()), "rows": "lm_head rows that are not all zero (the others are zero)"},
    )
    model = AutoModelForCausalLM.from_config(config)
    state = {k: v for k, v in draft.state_dict().items() if k != "lm_head.token_ids"}
    rows = state.pop("lm_head.weight")
    head = rows.new_zeros(int(config.vocab_size), rows.shape[1])
    head[ids] = rows
    state["lm_head.weight"] = head
    model.load_state_dict(state, strict=True)
    return model.eval()


def _narrow_mlp(state: dict[str, torch.Tensor], width: int) -> dict[str, torch.Tensor]:
    gate, up, down = state["mlp.gate_proj.weight"], state["mlp.up_proj.weight"], state["mlp.down_proj.weight"]
    score = gate.norm(dim=1) * up.norm(dim=1) * down.norm(dim=0)
    keep = torch.sort(score.topk(width).indices).values
    state = dict(state)
    state["mlp.gate_proj.weight"], state["mlp.up_proj.weight"] = gate[keep], up[keep]
    state["mlp.down_proj.weight"] = down[:, keep]
    return state


_registered = False


def register() -> None:
    """Make ``trtspec_draft`` directories loadable through AutoConfig / AutoModelForCausalLM (idempotent)."""
    global _registered
    if _registered:
        return
    AutoConfig.register(MODEL_TYPE, DraftConfig, exist_ok=True)
    AutoModelForCausalLM.register(DraftConfig, DraftForCausalLM, exist_ok=True)
    _registered = True
