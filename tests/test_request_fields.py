"""The request fields' one declaration (trtspec/request_fields.py) against upstream's recorded contracts: every
sampling field is an input of TensorRT-LLM's ensemble and of its tensorrt_llm model with the same type, under the
names the declaration gives (tests/upstream/ensemble_inputs.json, tensorrt_llm_template.json), and every table that
trtspec derives from it carries it."""

from __future__ import annotations

from tests.upstream import facts
from trtspec.request_fields import SAMPLING_FIELDS, SPECULATION_FIELDS
from trtspec.triton_repo import tensors


def _types(inputs) -> dict[str, str]:
    return {i["name"]: i["data_type"].removeprefix("TYPE_") for i in inputs}


def test_every_sampling_field_has_upstreams_names_and_types():
    ensemble = _types(facts.ensemble_inputs())
    engine = _types(facts.template()["inputs"])
    for f in SAMPLING_FIELDS:
        assert ensemble.get(f.name) == f.dtype, (f.name, ensemble.get(f.name))
        assert engine.get(f.engine) == f.dtype, (f.engine, engine.get(f.engine))


def test_the_derived_tables_carry_every_field_with_its_type():
    ensemble = {t.name: t.dtype for t in tensors.ENSEMBLE_INPUTS}
    for table in (tensors.ENGINE_INPUTS, tensors.BLS_INPUTS):
        names = {t.name: t.dtype for t in table}
        assert all(names.get(f.engine) == f.dtype for f in SAMPLING_FIELDS), names
    assert all(ensemble.get(f.name) == f.dtype for f in SAMPLING_FIELDS + SPECULATION_FIELDS)
    bls = {t.name: t.dtype for t in tensors.BLS_INPUTS}
    assert all(bls.get(f.engine) == f.dtype for f in SPECULATION_FIELDS)
    llmapi = {t.name for t in tensors.LLMAPI_INPUTS}
    assert {f.llmapi for f in SAMPLING_FIELDS if f.llmapi} <= llmapi
    # names are unique per level (one ensemble name and one engine name per field)
    assert len({f.name for f in SAMPLING_FIELDS}) == len({f.engine for f in SAMPLING_FIELDS}) == len(SAMPLING_FIELDS)
