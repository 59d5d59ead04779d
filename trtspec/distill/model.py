"""Building the distilled draft for training (``trtspec_draft``, trtspec.runtimes.torch.draft_model) from a
target, and turning it into what `trtspec distill` writes: :func:`to_standard` gives a standard checkpoint of the
target's family (full-vocabulary ``lm_head``: the trained rows at the frequent tokens, zero rows elsewhere, recorded
in config.json), from which trtspec's loader applies the frequent head (``frequent_head``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from trtspec.runtimes.torch.draft_model import DraftConfig, DraftForCausalLM


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
    from trtspec.runtimes.torch.frequent_head import CONFIG_KEY

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
