"""Preflight: draft/target compatibility, the memory plan (GPU, or this machine's RAM for the torch runtime), the
calibration file and the toolchain, from config, tokenizer and calibration files only (never weights)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum

from trtspec.build.engine_rules import broken_rules
from trtspec.build.formats import (
    Quantization,
    block_size_problem,
    block_size_text,
    formats_that_fit,
    linear_input_dims,
    needs_cuda,
    parse_capability,
)
from trtspec.build.layout import ROLES, is_quantized
from trtspec.build.memory import GIB, HostMemoryPlan, MemoryPlan, plan_host_memory, plan_memory
from trtspec.build.tokenizers import TokenizerInfo, first_vocab_difference, read_tokenizer
from trtspec.build.toolchain import Toolchain, detect_toolchain
from trtspec.errors import IncompatibleModelsError, TrtspecError
from trtspec.families import NormalizedConfig, known_families, read_config
from trtspec.spec import BuildSpec, Runtime
from trtspec.speculative.drafters import DrafterKind
from trtspec.speculative.rules import MAX_DRAFT_LEN


def drafters_served(spec: BuildSpec) -> set[DrafterKind]:
    """The drafters ``spec``'s runtime and orchestration serve (trtspec.speculative.drafters.registry)."""
    from trtspec.speculative.drafters.registry import served

    return set(served(spec.runtime, spec.triton.orchestration))


class Level(str, Enum):
    OK = "ok"
    WARN = "warn"
    ERROR = "error"


@dataclass(frozen=True)
class Finding:
    check: str
    level: Level
    detail: str
    hint: str | None = None


@dataclass
class CheckReport:
    findings: list[Finding] = field(default_factory=list)
    memory: MemoryPlan | None = None
    host_memory: HostMemoryPlan | None = None
    toolchain: Toolchain | None = None

    def add(self, check: str, level: Level, detail: str, hint: str | None = None) -> None:
        self.findings.append(Finding(check, level, detail, hint))

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level is Level.ERROR]

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "findings": [{**asdict(f), "level": f.level.value} for f in self.findings],
            "memory": self.memory.to_dict() if self.memory else None,
            "host_memory": self.host_memory.to_dict() if self.host_memory else None,
            "toolchain": self.toolchain.to_dict() if self.toolchain else None,
        }


def _load(report: CheckReport, spec: BuildSpec, role: str) -> tuple[NormalizedConfig, TokenizerInfo] | None:
    try:
        path = spec.model_path(role, weights=False)
        cfg = read_config(path)
        tok = read_tokenizer(path)
    except TrtspecError as exc:
        report.add(f"{role} model", Level.ERROR, exc.message, exc.hint)
        return None
    report.add(
        f"{role} model",
        Level.OK,
        f"{cfg.model_type}, {cfg.num_layers} layers, hidden {cfg.hidden_size}, {cfg.num_params / 1e6:.1f}M params",
    )
    return cfg, tok


def _check_family(report: CheckReport, spec: BuildSpec, role: str, cfg: NormalizedConfig) -> None:
    if cfg.model_type in known_families():
        report.add(f"{role} family", Level.OK, f"{cfg.model_type} (TRT-LLM decoder {cfg.family.decoder_type})")
    elif spec.runtime is Runtime.TORCH:
        # The torch runtime runs any transformers causal LM (trtspec's distilled drafts included): nothing to warn.
        report.add(
            f"{role} family",
            Level.OK,
            f"{cfg.model_type} (runs on the torch runtime; the TensorRT-LLM "
            f"runtimes take {', '.join(known_families())})",
        )
    else:
        report.add(
            f"{role} family",
            Level.ERROR,
            f"model family '{cfg.model_type}' is not supported by {spec.runtime.value}",
            f"supported: {', '.join(known_families())}; or use runtime torch",
        )


def _check_tokenizers(
    report: CheckReport, t: tuple[NormalizedConfig, TokenizerInfo], d: tuple[NormalizedConfig, TokenizerInfo]
) -> None:
    (tc, tt), (dc, dt) = t, d
    if tc.vocab_size != dc.vocab_size:
        report.add(
            "vocabulary size",
            Level.ERROR,
            f"target vocab_size {tc.vocab_size} != draft vocab_size {dc.vocab_size}",
            "draft and target must share one tokenizer and one vocabulary",
        )
    else:
        report.add("vocabulary size", Level.OK, f"{tc.vocab_size} (config), {len(tt.vocab)} tokenizer entries")
    diff = first_vocab_difference(tt.vocab, dt.vocab)
    if diff is None:
        report.add("token-to-id mapping", Level.OK, f"identical ({len(tt.vocab)} tokens)")
    else:
        report.add(
            "token-to-id mapping",
            Level.ERROR,
            f"tokenizers differ at {diff}",
            "use a draft trained with the target's tokenizer (same family), or distill one: trtspec distill",
        )
    for name, a, b in (
        ("bos", tc.bos_token_id, dc.bos_token_id),
        ("eos", tc.eos_token_ids, dc.eos_token_ids),
        ("pad", tc.pad_token_id, dc.pad_token_id),
    ):
        a_tok, b_tok = tt.special_ids.get(name), dt.special_ids.get(name)
        if a != b or a_tok != b_tok:
            level = Level.WARN if name == "pad" else Level.ERROR
            report.add(
                f"{name} id",
                level,
                f"target {a} (tokenizer {a_tok}), draft {b} (tokenizer {b_tok})",
                "the pair must stop on the same tokens"
                if name != "pad"
                else "trtspec pads with the target's pad id; harmless, but check the draft's export",
            )
        else:
            report.add(f"{name} id", Level.OK, f"{a}")


def _check_context(report: CheckReport, spec: BuildSpec, role: str, cfg: NormalizedConfig) -> None:
    if cfg.max_position_embeddings < spec.engine.max_seq_len:
        report.add(
            f"{role} context",
            Level.ERROR,
            f"max_position_embeddings {cfg.max_position_embeddings} < engine.max_seq_len {spec.engine.max_seq_len}",
            f"set engine.max_seq_len <= {cfg.max_position_embeddings}",
        )
    else:
        report.add(
            f"{role} context",
            Level.OK,
            f"max_position_embeddings {cfg.max_position_embeddings} >= max_seq_len {spec.engine.max_seq_len}",
        )


def _check_quantization(
    report: CheckReport, spec: BuildSpec, role: str, cfg: NormalizedConfig, tools: Toolchain
) -> None:
    q = getattr(spec, role).quantization
    dims = linear_input_dims(cfg)
    problem = block_size_problem(q, dims)
    if problem is not None:
        report.add(
            f"{role} quantization",
            Level.ERROR,
            block_size_text(q, problem),
            f"use {', '.join(_formats_that_build(spec, role, dims, tools))} for this model",
        )
        return
    if needs_cuda(q) and not tools.has_gpu:
        others = [f for f in formats_that_fit(dims, cuda_available=False) if f != "none"]
        report.add(
            f"{role} quantization",
            Level.ERROR,
            f"{q.value} calibration needs a CUDA GPU and none is here",
            f"run `trtspec quantize` on a GPU machine, or pick one of {', '.join(others)}",
        )
        return
    report.add(f"{role} quantization", Level.OK, f"{q.value}")
    if spec.runtime is Runtime.TRTLLM_ENGINE:
        _check_engine_build(report, spec, role)


def _formats_that_build(spec: BuildSpec, role: str, dims: list[tuple[str, int]], tools: Toolchain) -> list[str]:
    """The quantization formats this model's shapes take here that the runtime's builder rules also allow."""
    fits = [f for f in formats_that_fit(dims, cuda_available=tools.has_gpu) if f != "none"]
    if spec.runtime is not Runtime.TRTLLM_ENGINE:
        return fits
    kv, cc = getattr(spec, role).kv_cache, parse_capability(spec.gpu.compute_capability)
    return [f for f in fits if not broken_rules(Quantization(f), kv, cc)]


def _check_engine_build(report: CheckReport, spec: BuildSpec, role: str) -> None:
    """The TensorRT-LLM builder rules (trtspec.build.engine_rules) for this model's formats and the spec's GPU."""
    model = getattr(spec, role)
    q, kv = model.quantization, model.kv_cache
    broken = broken_rules(q, kv, parse_capability(spec.gpu.compute_capability))
    for rule in broken:
        report.add(
            f"{role} engine build",
            Level.ERROR,
            f"{q.value} with kv_cache {kv.value} breaks TensorRT-LLM builder rule {rule.name}: {rule.upstream}",
            f"use {rule.works(q, kv)} ({rule.source})",
        )
    if not broken:
        report.add(f"{role} engine build", Level.OK, f"{q.value} with kv_cache {kv.value}: no builder rule broken")


def _check_speculative(report: CheckReport, spec: BuildSpec, t: NormalizedConfig, d: NormalizedConfig) -> None:
    k = spec.speculative.max_draft_len
    room = spec.engine.max_seq_len - spec.engine.max_input_len
    if k >= room:
        report.add(
            "draft length",
            Level.ERROR,
            f"K={k} leaves no room: max_seq_len - max_input_len = {room}",
            "lower speculative.max_draft_len or raise engine.max_seq_len",
        )
    else:
        report.add("draft length", Level.OK, f"K={k} (runtime {spec.runtime.value} allows 1..{MAX_DRAFT_LEN})")
    ratio = d.num_params / max(t.num_params, 1)
    if ratio > 0.5:
        report.add(
            "draft size",
            Level.WARN,
            f"draft has {ratio:.0%} of the target's parameters",
            "a draft pays off when one of its steps costs a small fraction of a target step",
        )
    else:
        report.add("draft size", Level.OK, f"draft/target parameters = {ratio:.3f}")
    if spec.speculative.use_draft_logits and spec.runtime is Runtime.TRTLLM_LLMAPI:
        report.add(
            "draft logits",
            Level.WARN,
            "the LLM API DraftTarget path accepts by exact match only",
            "use_draft_logits applies to the trtllm-engine runtime",
        )


def _check_drafter(report: CheckReport, spec: BuildSpec, t: NormalizedConfig, tt: TokenizerInfo) -> None:
    from trtspec.speculative.drafters.registry import entry, place

    kind = spec.speculative.drafter
    drafter = entry(kind)
    served = drafters_served(spec)
    where = place(spec.runtime, spec.triton.orchestration)
    if kind not in served:
        names = ", ".join(k.value for k in served)
        report.add(
            "drafter",
            Level.ERROR,
            f"{where} does not serve drafter '{kind.value}' ({drafter.llmapi_note}; it serves: {names})",
            f"use speculative.drafter: {names.split(', ')[0]}, or runtime torch or trtllm-engine",
        )
    elif where == "trtllm-llmapi" and drafter.llmapi_note:
        report.add("drafter", Level.WARN, f"{kind.value} on trtllm-llmapi: {drafter.llmapi_note}", None)
    else:
        report.add("drafter", Level.OK, f"{kind.value}: {drafter.summary}")
    if not drafter.uses_pool:
        return
    pool = spec.ngram_pool_path
    if not pool.is_file() and spec.speculative.ngram_pool is None:
        # The default pool (next to the draft) is optional: without it the drafter proposes by prompt lookup only.
        report.add(
            "n-gram pool",
            Level.WARN,
            f"{pool}: missing; the {kind.value} drafter proposes by prompt lookup only",
            "trtspec distill writes ngram_pool.npz next to the draft; or set speculative.ngram_pool",
        )
        return
    try:
        from trtspec.speculative.drafters.ngram import read_pool_meta, vocab_fingerprint

        meta = read_pool_meta(pool)
    except (OSError, KeyError, ValueError) as exc:
        level = Level.WARN if spec.runtime is Runtime.TRTLLM_LLMAPI else Level.ERROR
        report.add(
            "n-gram pool",
            level,
            f"{pool}: {'missing' if not pool.is_file() else f'not a pool ({exc})'}",
            "trtspec distill writes ngram_pool.npz next to the draft; set speculative.ngram_pool to one",
        )
        return
    fingerprint = meta.get("tokenizer_sha256")
    if int(meta["vocab_size"]) != t.vocab_size or fingerprint not in (None, vocab_fingerprint(tt.vocab)):
        report.add(
            "n-gram pool",
            Level.ERROR,
            f"{pool}: built with another tokenizer than the target's",
            "rebuild it with trtspec distill for this target",
        )
        return
    detail = f"{pool.name}: {meta['tokens']:,} tokens ({meta.get('source', 'unknown source')})"
    if spec.runtime is Runtime.TRTLLM_LLMAPI:
        report.add(
            "n-gram pool",
            Level.WARN,
            detail + "; TensorRT-LLM's NGram drafter builds its own pool from the "
            "requests it serves (public pool) and cannot be pre-seeded from this file",
            "its acceptance starts at prompt lookup's and grows with traffic",
        )
    else:
        report.add("n-gram pool", Level.OK, detail)


def _check_host_memory(report: CheckReport, spec: BuildSpec, t: NormalizedConfig, d: NormalizedConfig) -> None:
    """The torch runtime runs on this machine's CPU: its RAM is what must hold the models (spec.gpu is not used)."""
    plan = plan_host_memory(spec, t, d)
    report.host_memory = plan
    need, avail, total = plan.needed_bytes / GIB, plan.available_bytes / GIB, plan.total_bytes / GIB
    detail = (
        f"torch runtime on this machine's CPU: about {need:.2f} GiB (weights x instances + KV for "
        f"{plan.kv_tokens:,} tokens) of {avail:.1f} GiB available ({total:.1f} GiB RAM); the gpu section is "
        "not used"
    )
    if plan.needed_bytes > plan.total_bytes:
        report.add("host memory", Level.ERROR, detail, "lower engine.max_batch_size / max_seq_len or the instances")
    elif plan.needed_bytes > plan.available_bytes:
        report.add("host memory", Level.WARN, detail, "other processes hold the rest: the server may swap")
    else:
        report.add("host memory", Level.OK, detail)


def _check_dtype(report: CheckReport, spec: BuildSpec) -> None:
    if spec.runtime is Runtime.TORCH:
        return
    for role in ROLES:
        dtype = getattr(spec, role).dtype
        if dtype.value == "float32":
            report.add(
                f"{role} dtype",
                Level.WARN,
                f"float32 on {spec.runtime.value}: twice the memory of bfloat16 and no tensor-core kernels",
                f"set {role}.dtype: bfloat16 (or float16)",
            )


def _check_calibration(report: CheckReport, spec: BuildSpec) -> None:
    """The calibration file is read only when something is quantized; then it must be there and hold text."""
    from trtspec.build.calibration import read_documents

    used = [r for r in ROLES if is_quantized(spec, r)]
    file = spec.calibration.file
    if not used:
        detail = "not used: nothing is quantized" + (f" ({file} is ignored)" if file else "")
        report.add("calibration", Level.OK, detail)
        return
    if file is None:
        report.add("calibration", Level.OK, f"the corpus shipped with trtspec, for {' and '.join(used)}")
        return
    path = spec.resolve(file)
    try:
        docs = read_documents(path, spec.calibration.field)
    except TrtspecError as exc:
        report.add("calibration", Level.ERROR, exc.message, exc.hint)
        return
    report.add("calibration", Level.OK, f"{path}: {len(docs):,} documents, for {' and '.join(used)}")


def _check_memory(report: CheckReport, spec: BuildSpec, t: NormalizedConfig, d: NormalizedConfig) -> None:
    if spec.runtime is Runtime.TORCH:
        _check_host_memory(report, spec, t, d)
        return
    plan = plan_memory(spec, t, d)
    report.memory = plan
    if spec.target.tp_size > spec.gpu.count:
        report.add(
            "GPU count",
            Level.ERROR,
            f"target.tp_size {spec.target.tp_size} > gpu.count {spec.gpu.count}",
            "lower target.tp_size or raise gpu.count",
        )
    if plan.free_for_kv_gpu0 <= 0:
        report.add(
            "GPU memory",
            Level.ERROR,
            f"weights need {(plan.target.weight_bytes_per_gpu + plan.draft.weight_bytes_per_gpu) / GIB:.1f} GiB"
            f" on GPU 0 but {plan.usable_bytes_per_gpu / GIB:.1f} GiB are usable",
            "quantize harder, raise target.tp_size, or use a larger GPU",
        )
    elif not plan.kv_sufficient:
        report.add(
            "KV cache",
            Level.WARN,
            f"room for {plan.kv_tokens_capacity:,} tokens < max_batch_size x max_seq_len = {plan.kv_tokens_needed:,}",
            "requests will queue for KV blocks; lower max_batch_size or use fp8 KV cache",
        )
    else:
        report.add(
            "GPU memory",
            Level.OK,
            f"{plan.free_for_kv_gpu0 / GIB:.1f} GiB left for KV on GPU 0: {plan.kv_tokens_capacity:,} tokens"
            f" (need {plan.kv_tokens_needed:,})",
        )


def _check_toolchain(report: CheckReport, spec: BuildSpec, tools: Toolchain) -> None:
    report.toolchain = tools
    if spec.runtime is Runtime.TORCH:
        report.add(
            "runtime",
            Level.OK if tools.torch_installed else Level.ERROR,
            "torch runtime: runs on this machine" if tools.torch_installed else "torch is not installed",
            None if tools.torch_installed else "pip install 'trtspec[torch]'",
        )
    else:
        if tools.trtllm_build:
            report.add("runtime", Level.OK, f"trtllm-build at {tools.trtllm_build}")
        else:
            report.add(
                "runtime",
                Level.WARN,
                f"{spec.runtime.value}: no trtllm-build and no GPU here",
                "`trtspec compile` prints the docker command that runs it in the NGC image",
            )
    report.add(
        "tritonserver",
        Level.OK if tools.tritonserver else Level.WARN,
        tools.tritonserver or "no tritonserver binary found",
        None if tools.tritonserver else "pip install 'trtspec[serve]' (bundles one), or use serve --docker",
    )


def run_check(spec: BuildSpec, toolchain: Toolchain | None = None) -> CheckReport:
    """Every preflight check; never raises for a problem it can report."""
    report = CheckReport()
    tools = toolchain or detect_toolchain()
    t = _load(report, spec, "target")
    d = _load(report, spec, "draft")
    if t is not None and d is not None:
        _check_family(report, spec, "target", t[0])
        _check_family(report, spec, "draft", d[0])
        _check_tokenizers(report, t, d)
        for role, (cfg, _) in (("target", t), ("draft", d)):
            _check_context(report, spec, role, cfg)
            _check_quantization(report, spec, role, cfg, tools)
        _check_speculative(report, spec, t[0], d[0])
        _check_drafter(report, spec, t[0], t[1])
        _check_memory(report, spec, t[0], d[0])
    _check_dtype(report, spec)
    _check_calibration(report, spec)
    _check_toolchain(report, spec, tools)
    return report


def check_pair(spec: BuildSpec) -> None:
    """Raise IncompatibleModelsError unless draft and target can be paired: both readable, one vocabulary, one
    token-to-id mapping, the same bos/eos ids. The rule `check` applies, for the paths that skip `check`."""
    report = CheckReport()
    t = _load(report, spec, "target")
    d = _load(report, spec, "draft")
    if t is not None and d is not None:
        _check_tokenizers(report, t, d)
    if report.errors:
        first = report.errors[0]
        raise IncompatibleModelsError(f"{first.check}: {first.detail}", hint=first.hint)
