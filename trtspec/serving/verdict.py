"""Whether speculative decoding paid, in one plain sentence, from `trtspec bench` figures measured side by side."""

from __future__ import annotations

from typing import Any

PAID = 1.05  # speedups within 5 % of 1 are "no measurable difference" at these request counts


def speedup_verdict(
    level: dict[str, Any],
    max_draft_len: int | None = None,
    route_threshold: int | None = None,
    max_tokens: int | None = None,
) -> str | None:
    """One sentence about one bench level (with its target-only baseline): the speedup and, when speculation did not
    pay, why, from the measured acceptance and the cost of a speculative step that the speedup implies."""
    spec, base = level.get("speculative"), level.get("target_only")
    if not spec or not base or not base.get("output_tok_per_s"):
        return None
    s = spec["output_tok_per_s"] / base["output_tok_per_s"]
    a = float(spec.get("acceptance_rate") or 0.0)
    figures = (
        f"{s:.2f}x target-only ({spec['output_tok_per_s']:.1f} vs {base['output_tok_per_s']:.1f} output "
        f"tok/s at concurrency {level.get('concurrency', 1)}, acceptance {a:.2f})"
    )
    if s >= PAID:
        return f"speculative decoding paid on this machine: {figures}."
    head = (
        "speculative decoding made no measurable difference on this machine"
        if s > 1 / PAID
        else "speculative decoding did not pay on this machine"
    )
    if a == 0.0 and route_threshold is not None and max_tokens is not None and max_tokens < route_threshold:
        return (
            f"{head}: {figures}. No draft tokens were proposed: requests asking fewer than route_threshold "
            f"({route_threshold}) tokens go to the target alone."
        )
    if not max_draft_len:
        return (
            f"{head}: {figures}. The target kept {a:.0%} of the draft's proposals; too few to pay for drafting "
            "and verifying them here."
        )
    k = max_draft_len
    per_step = 1 + a * k  # tokens a speculative step commits (accepted drafts + the target's own), about
    cost = per_step / s  # what one speculative step cost, in target-only steps, implied by the measured speedup
    return (
        f"{head}: {figures}. Why: the target kept {a:.0%} of the proposals (up to {k} a step), so a step of {k} "
        f"proposals gave about {per_step:.1f} tokens where a target-only step gives 1, but cost about {cost:.1f} "
        f"target steps (drafting, plus verifying up to {k + 1} tokens at once). It pays when the draft agrees more "
        "often or verifying several tokens costs little more than one step (`trtspec tune` measures that cost, v; "
        "on a CPU the bfloat16 path brings it to about 1 where the CPU has native bfloat16)."
    )
