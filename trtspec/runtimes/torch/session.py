"""Text in, text out: a target + draft pair from a spec with its tokenizer, chat template and incremental
detokenizer."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.errors import GenerationError
from trtspec.runtimes.torch.decoder import GenerationResult, SpeculativeDecoder
from trtspec.runtimes.torch.loading import load_model, load_tokenizer
from trtspec.spec import BuildSpec
from trtspec.speculative.drafters import DrafterKind
from trtspec.speculative.drafters.registry import entry as drafter_entry
from trtspec.speculative.sampling import SamplingParams


def eos_ids_of(model: Any, tokenizer: Any) -> list[int]:
    """Stop tokens: the generation config's eos ids (int or list) and the tokenizer's eos token."""
    ids: list[int] = []
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (gen_eos, getattr(model.config, "eos_token_id", None), tokenizer.eos_token_id):
        if value is None:
            continue
        ids += list(value) if isinstance(value, (list, tuple)) else [int(value)]
    return sorted(set(ids))


class IncrementalDetokenizer:
    """Text deltas for a growing token list, holding back incomplete multi-byte characters (U+FFFD at the end)."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.tokens: list[int] = []
        self.emitted = ""

    def push(self, new_tokens: list[int]) -> str:
        self.tokens += new_tokens
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=self.skip)
        if text.endswith("\ufffd"):
            return ""
        delta = text[len(self.emitted) :] if text.startswith(self.emitted) else text
        self.emitted = text
        return delta

    def flush(self) -> str:
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=self.skip)
        delta = text[len(self.emitted) :] if text.startswith(self.emitted) else ""
        self.emitted = text
        return delta


@dataclass
class TextResult:
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: dict
    # With logprobs: per token {"token", "text", "logprob", "top": [{"token", "text", "logprob"}]} (the target's)
    logprobs: list[dict] | None = None

    def to_dict(self) -> dict:
        out = {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "stats": self.stats,
        }
        if self.logprobs is not None:
            out["logprobs"] = self.logprobs
        return out


class TorchSession:
    """The torch runtime for one spec: models loaded once, prompts encoded with the target's chat template."""

    def __init__(
        self,
        target_dir: Path,
        draft_dir: Path | None,
        *,
        dtype: str = "float32",
        draft_dtype: str | None = None,
        max_draft_len: int = 4,
        drafter: DrafterKind | str = "model",
        ngram_pool: Any = None,
    ) -> None:
        """``drafter`` and ``ngram_pool``: see ``SpeculativeDecoder`` (ngram needs no draft_dir)."""
        self.tokenizer = load_tokenizer(target_dir)
        self.target = load_model(target_dir, dtype)
        self.draft = load_model(draft_dir, draft_dtype or dtype) if draft_dir is not None else None
        pad = self.tokenizer.pad_token_id
        drafter = DrafterKind(drafter)
        if drafter is DrafterKind.HYBRID and self.draft is None:
            drafter = DrafterKind.NGRAM  # no draft loaded: nothing but the n-grams could draft (the hybrid needs it)
        self.decoder = SpeculativeDecoder(
            self.target,
            self.draft,
            max_draft_len=max_draft_len,
            eos_ids=eos_ids_of(self.target, self.tokenizer),
            pad_id=pad if pad is not None else 0,
            drafter=drafter,
            ngram_pool=ngram_pool,
        )

    @classmethod
    def from_spec(cls, spec: BuildSpec, with_draft: bool = True, load_draft: bool | None = None) -> TorchSession:
        """Load the models the torch runtime serves for this spec (quantized checkpoints once built) and its drafter
        (``speculative.drafter``; the n-gram pool for ngram and hybrid). ``with_draft=False``: target only.
        ``load_draft`` (default: unless the drafter is ngram, which drafts without it) loads the draft model."""
        from trtspec.build.layout import serving_model_dir
        from trtspec.families import read_config
        from trtspec.spec import Runtime
        from trtspec.speculative.drafters.ngram import pool_for_spec

        def model_dir(role: str) -> Path:
            if spec.runtime is Runtime.TORCH:
                path = serving_model_dir(spec, role)
                if path.is_dir():
                    return path
            return spec.model_path(role)

        kind = spec.speculative.drafter
        if load_draft is None:
            load_draft = drafter_entry(kind).runs_draft_model
        pool = None
        if with_draft and drafter_entry(kind).uses_pool:
            pool = pool_for_spec(spec, read_config(model_dir("target")).vocab_size)
        return cls(
            model_dir("target"),
            model_dir("draft") if with_draft and load_draft else None,
            dtype=spec.target.dtype.value,
            draft_dtype=spec.draft.dtype.value,
            max_draft_len=spec.speculative.max_draft_len,
            drafter=kind if with_draft else DrafterKind.MODEL,
            ngram_pool=pool,
        )

    def encode(self, prompt: str, chat: bool = True) -> list[int]:
        """Token ids of a prompt, through the chat template when the tokenizer has one and ``chat`` is set."""
        if not prompt.strip():
            raise GenerationError("the prompt is empty", hint="give some text to continue")
        from trtspec.prompts import encode_prompt

        return encode_prompt(self.tokenizer, prompt, chat)

    def _result(self, r: GenerationResult) -> TextResult:
        text = self.tokenizer.decode(r.token_ids, skip_special_tokens=True)
        lps = None
        if r.logprobs is not None:

            def one(token: int, logprob: float) -> dict:
                piece = self.tokenizer.decode([token], skip_special_tokens=False)
                return {"token": token, "text": piece, "logprob": round(logprob, 6)}

            lps = [{**one(t.token, t.logprob), "top": [one(i, v) for i, v in t.top]} for t in r.logprobs]
        return TextResult(text, r.token_ids, r.finish_reason, r.stats.to_dict(), lps)

    def generate(
        self,
        prompt: str,
        max_tokens: int,
        sampling: SamplingParams | None = None,
        *,
        num_draft_tokens: int | None = None,
        use_draft: bool = True,
        chat: bool = True,
        logprobs: int | None = None,
    ) -> TextResult:
        ids = self.encode(prompt, chat)
        result = self.decoder.generate(
            [ids], max_tokens, sampling, num_draft_tokens=num_draft_tokens, use_draft=use_draft, logprobs=logprobs
        )[0]
        return self._result(result)

    def stream(
        self,
        prompt: str,
        max_tokens: int,
        sampling: SamplingParams | None = None,
        *,
        num_draft_tokens: int | None = None,
        use_draft: bool = True,
        chat: bool = True,
    ) -> Iterator[str | TextResult]:
        """Yield text deltas as steps commit tokens, then the final TextResult."""
        ids = self.encode(prompt, chat)
        detok = IncrementalDetokenizer(self.tokenizer)
        events = self.decoder.stream(ids, max_tokens, sampling, num_draft_tokens=num_draft_tokens, use_draft=use_draft)
        for event in events:
            if isinstance(event, GenerationResult):
                tail = detok.flush()
                if tail:
                    yield tail
                yield self._result(event)
            else:
                delta = detok.push(event)
                if delta:
                    yield delta
