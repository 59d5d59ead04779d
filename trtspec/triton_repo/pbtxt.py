"""config.pbtxt through Triton's own schema: every model's ``ModelConfig`` is built by ``new_config`` from
``TensorSpec`` tables (trtspec.triton_repo.tensors), written by ``serialize`` and read by ``parse``.

Never string templates: an unknown field or a wrong type fails here, not at server start (cf. pytriton's
``model_config/generator.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trtspec.errors import SpecError, TrtspecError


def _pb() -> Any:
    try:
        from tritonclient.grpc import model_config_pb2
    except ImportError:
        from trtspec.errors import MissingDependencyError

        raise MissingDependencyError(
            "writing a Triton repository needs tritonclient (its model_config protobuf)",
            hint="pip install 'trtspec[repo]'",
        ) from None
    return model_config_pb2


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: name, Triton type (``INT32``, ``STRING`` ...), dims without the batch dimension."""

    name: str
    dtype: str
    dims: Sequence[int]
    optional: bool = False
    reshape: Sequence[int] | None = None  # e.g. () for TRT-LLM's `reshape: { shape: [ ] }`
    ragged: bool = False


@dataclass(frozen=True)
class Batching:
    """``dynamic_batching``: the queue delay, preferred batch sizes, and a bound on the queue (None: unbounded)."""

    max_queue_delay_us: int
    preferred: Sequence[int] = ()
    max_queue_size: int | None = None


def new_config(
    name: str,
    *,
    backend: str | None = None,
    platform: str | None = None,
    max_batch_size: int = 0,
    decoupled: bool | None = None,
    instances: int | None = None,
    parameters: Mapping[str, Any] | None = None,
    inputs: Iterable[TensorSpec] = (),
    outputs: Iterable[TensorSpec] = (),
    batching: Batching | None = None,
) -> Any:
    """A model's ModelConfig: every model of a repository is built here (and written by ``serialize``)."""
    pb = _pb()
    c = pb.ModelConfig(name=name, max_batch_size=max_batch_size)
    if backend:
        c.backend = backend
    if platform:
        c.platform = platform
    if decoupled is not None:
        c.model_transaction_policy.decoupled = decoupled
    if batching is not None:
        c.dynamic_batching.SetInParent()
        c.dynamic_batching.max_queue_delay_microseconds = batching.max_queue_delay_us
        c.dynamic_batching.preferred_batch_size[:] = list(batching.preferred)
        if batching.max_queue_size is not None:
            c.dynamic_batching.default_queue_policy.max_queue_size = batching.max_queue_size
    for s in inputs:
        t = c.input.add(
            name=s.name,
            data_type=pb.DataType.Value(f"TYPE_{s.dtype}"),
            dims=list(s.dims),
            optional=s.optional,
            allow_ragged_batch=s.ragged,
        )
        if s.reshape is not None:
            t.reshape.SetInParent()
            t.reshape.shape[:] = list(s.reshape)
    for s in outputs:
        c.output.add(name=s.name, data_type=pb.DataType.Value(f"TYPE_{s.dtype}"), dims=list(s.dims))
    if instances is not None:  # a CPU-side instance: GPU placement is the model's own (or the backend's) business
        c.instance_group.add(count=instances, kind=pb.ModelInstanceGroup.KIND_CPU)
    for key, value in (parameters or {}).items():
        c.parameters[key].string_value = _param(value)
    return c


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def serialize(config: Any) -> str:
    """config.pbtxt text, checked to parse back into the same ModelConfig (what Triton reads is what was built).

    ``max_batch_size: 0`` is written explicitly, after ``backend``/``platform`` as upstream's templates place it (proto3
    drops zero values, and Triton's config auto-completion may otherwise fill in a batch size the model was not written
    for)."""
    from google.protobuf import text_format

    text = text_format.MessageToString(config)
    if config.max_batch_size == 0:
        lines = text.splitlines()
        at = next((i + 1 for i, line in enumerate(lines) if line.startswith(("backend:", "platform:"))), 1)
        lines.insert(at, "max_batch_size: 0")
        text = "\n".join(lines) + "\n"
    source = f"{config.name}/config.pbtxt"
    if parse(text, source) != config:
        raise SpecError(
            f"{source} does not round-trip through the ModelConfig schema", hint="report this as a trtspec bug"
        )
    return text


def parse(text: str, source: str = "config.pbtxt") -> Any:
    """Parse a config.pbtxt; an unknown field or bad value raises TrtspecError naming the file."""
    from google.protobuf import text_format

    try:
        return text_format.Parse(text, _pb().ModelConfig())
    except text_format.ParseError as exc:
        raise TrtspecError(
            f"{source}: not a valid Triton model config ({exc})",
            hint="configs are written by `trtspec repo`; rewrite the repository",
        ) from None


def dtype_name(data_type: int) -> str:
    return str(_pb().DataType.Name(data_type)).removeprefix("TYPE_")
