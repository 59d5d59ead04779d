"""What the OpenAI frontend needs to know about a served repository, read from the repository itself.

The frontend applies the chat template and checks the context before anything reaches Triton, so it reads the same
settings the models read: ``preprocessing``'s tokenizer and limits and ``tensorrt_llm_bls``'s K and route threshold
(ensemble repositories), or ``tensorrt_llm/1/model.yaml`` (the LLM-API repository). Its paths are the ones Triton
sees; where one does not exist on this machine (the LLM-API model names container paths such as
``/checkpoints/target``), the repository manifest's ``container_mounts`` map it back to the host directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.errors import ServerError
from trtspec.triton_repo.names import ENSEMBLE, LLMAPI, PRE, TARGET


@dataclass(frozen=True)
class ServedDeployment:
    """The served model: its id, contract, tokenizer and limits."""

    name: str
    contract: str  # "ensemble" | "llmapi"
    entry_model: str
    runtime: str
    tokenizer_dir: Path
    add_special_tokens: bool
    max_input_len: int
    max_seq_len: int
    max_draft_len: int
    route_threshold: int
    draft_target_model: str | None = None  # ensemble repositories: the model the frontend sends token requests to

    @property
    def per_request_draft_len(self) -> bool:
        """Whether a request may set its own K (the LLM API applies the deployment's to every request)."""
        return self.contract == "ensemble"

    def info(self) -> dict[str, Any]:
        """The deployment as the frontend's /v1/models extension field shows it."""
        return {
            "runtime": self.runtime,
            "contract": self.contract,
            "max_draft_len": self.max_draft_len,
            "route_threshold": self.route_threshold,
            "max_input_len": self.max_input_len,
            "max_seq_len": self.max_seq_len,
            "per_request_draft_len": self.per_request_draft_len,
        }

    @classmethod
    def from_repo(cls, repo: Path, name: str | None = None) -> ServedDeployment:
        """Read ``repo`` (a repository trtspec wrote); ``name`` overrides the spec's name from the manifest."""
        from trtspec.build.artifacts import read_manifest
        from trtspec.triton_repo.validate import load_configs

        repo = Path(repo)
        try:
            configs = load_configs(repo)
        except Exception as exc:  # noqa: BLE001 - any unreadable repository is the same message
            raise ServerError(
                f"{repo}: cannot read the model repository ({exc})", hint="serve a repository written by `trtspec repo`"
            ) from None
        manifest = read_manifest(repo) or {}
        settings = manifest.get("settings") or {}
        served = name or settings.get("name") or repo.name
        mounts = {inside: host for host, inside in manifest.get("container_mounts") or []}
        if ENSEMBLE in configs:
            pre = _params(configs.get(PRE))
            from trtspec.triton_repo.names import DRAFT_TARGET_MODELS, draft_target_params

            params_of = {m: _params(configs.get(m)) for m in DRAFT_TARGET_MODELS}
            bls = draft_target_params(params_of)
            middle = next((m for m in DRAFT_TARGET_MODELS if "max_draft_len" in params_of[m]), None)
            if "tokenizer_dir" not in pre:
                raise ServerError(
                    f"{repo}: its preprocessing model names no tokenizer_dir",
                    hint="rewrite the repository with `trtspec repo`",
                )
            engine = configs.get(TARGET)
            runtime = settings.get("runtime") or (
                "trtllm-engine" if engine is not None and engine.backend == "tensorrtllm" else "torch"
            )
            return cls(
                name=served,
                contract="ensemble",
                entry_model=ENSEMBLE,
                runtime=runtime,
                tokenizer_dir=_local(pre["tokenizer_dir"], mounts, repo / PRE / "1"),
                add_special_tokens=pre.get("add_special_tokens", "true").lower() in ("1", "true", "yes"),
                max_input_len=int(pre.get("max_input_len", 0) or 0),
                max_seq_len=int(pre.get("max_seq_len", 0) or bls.get("max_seq_len", 0) or 0),
                max_draft_len=int(bls.get("max_draft_len", 0) or 0),
                route_threshold=int(bls.get("route_threshold", 0) or 0),
                draft_target_model=middle,
            )
        if LLMAPI in configs and (repo / LLMAPI / "1" / "model.yaml").is_file():
            import yaml

            data = yaml.safe_load((repo / LLMAPI / "1" / "model.yaml").read_text(encoding="utf-8")) or {}
            spec = data.get("speculative_config") or {}
            engine = settings.get("engine") or {}
            max_seq_len = int(data.get("max_seq_len") or engine.get("max_seq_len") or 0)
            return cls(
                name=served,
                contract="llmapi",
                entry_model=LLMAPI,
                runtime="trtllm-llmapi",
                tokenizer_dir=_local(str(data.get("tokenizer") or data["model"]), mounts),
                add_special_tokens=True,  # the LLM API tokenizes text prompts with special tokens
                max_input_len=int(engine.get("max_input_len") or max_seq_len),
                max_seq_len=max_seq_len,
                max_draft_len=int(spec.get("max_draft_len") or 0),
                route_threshold=0,
            )
        raise ServerError(
            f"{repo}: neither an ensemble nor an LLM-API model ({', '.join(sorted(configs))})",
            hint="serve a repository written by `trtspec repo`",
        )


def _params(config: Any) -> dict[str, str]:
    if config is None:
        return {}
    return {k: v.string_value for k, v in config.parameters.items()}


def _local(path: str, mounts: dict[str, str], version_dir: Path | None = None) -> Path:
    """``path`` as it exists here: itself, or the host directory a container mount maps it from; a relative path is
    the model's own file, relative to its version directory (``version_dir``: runtime_utils.model_file)."""
    if version_dir is not None and not Path(path).is_absolute():
        return Path(version_dir) / path
    if Path(path).exists():
        return Path(path)
    for inside, host in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
        if path == inside or path.startswith(inside.rstrip("/") + "/"):
            return Path(host + path[len(inside) :])
    return Path(path)
