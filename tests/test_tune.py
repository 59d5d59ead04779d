"""`trtspec tune`: its K is the one a brute-force sweep of the real decoder finds fastest on costs the test sets;
the spec edit keeps comments; the exact simulation matches the decoder's step counts."""

from __future__ import annotations

import json

import pytest

from trtspec.spec_edit import set_section_values

PROMPTS = [
    "The quick brown",
    "def add(a, b):\n    return a",
    "Q: What is the capital of France? A:",
    "Speculative decoding lets a small",
]
MAX_TOKENS = 32
# A verification that grows with K and a draft that costs a tenth of a target step: the best K is in the middle.
COSTS = {"c": 0.1, "v": {str(k): 1.0 + 0.1 * k for k in range(1, 9)}}


@pytest.fixture(scope="module")
def noisy_pair(tiny_pair, tmp_path_factory):
    """The tiny target and a draft that agrees with it part of the time (the target with noise on its weights)."""
    import torch

    from trtspec.runtimes.torch.loading import load_model, load_tokenizer

    draft = load_model(tiny_pair[0])
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.001)
    out = tmp_path_factory.mktemp("noisy") / "draft"
    draft.save_pretrained(out)
    load_tokenizer(tiny_pair[0]).save_pretrained(out)
    return tiny_pair[0], out


@pytest.fixture
def spec_file(noisy_pair, tmp_path):
    text = (
        "# tuned by the test\nname: tiny\nruntime: torch\ntarget:\n  model: {t}\n  dtype: float32\n"
        "draft:\n  model: {d}\n  dtype: float32\nspeculative:\n  max_draft_len: 1  # K: draft tokens\n"
        "  drafter: model\n"
        "  route_threshold: 0\nengine:\n  max_input_len: 256\n  max_seq_len: 512\n"
    ).format(t=noisy_pair[0], d=noisy_pair[1])
    path = tmp_path / "trtspec.yaml"
    path.write_text(text)
    (tmp_path / "prompts.txt").write_text("\n".join(p.replace("\n", " ") for p in PROMPTS) + "\n")
    (tmp_path / "costs.json").write_text(json.dumps(COSTS))
    return path


def brute_force(noisy_pair, prompts_text, ks):
    """Decode every prompt at every K with the real decoder; cost each step as the test's costs say."""
    from trtspec.prompts import encode_prompt
    from trtspec.runtimes.torch.decoder import SpeculativeDecoder
    from trtspec.runtimes.torch.loading import load_model, load_tokenizer
    from trtspec.runtimes.torch.session import eos_ids_of

    target, draft, tok = load_model(noisy_pair[0]), load_model(noisy_pair[1]), load_tokenizer(noisy_pair[0])
    dec = SpeculativeDecoder(
        target, draft, max_draft_len=max(ks), eos_ids=eos_ids_of(target, tok), pad_id=tok.pad_token_id
    )
    ids = [encode_prompt(tok, p) for p in prompts_text]
    cost, steps = {}, {}
    for k in ks:
        total, n_steps = 0.0, 0
        for p in ids:
            out = 0
            for event in dec.stream(p, MAX_TOKENS, num_draft_tokens=k):
                if not isinstance(event, list):
                    continue
                k_eff = max(0, min(k, MAX_TOKENS - out - 1))
                total += k_eff * COSTS["c"] + (COSTS["v"][str(k_eff)] if k_eff else 1.0)
                out += len(event)
                n_steps += 1
        cost[k], steps[k] = total, n_steps
    return cost, steps


def run_tune(capsys, *args):
    from trtspec.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["tune", *args])
    captured = capsys.readouterr()
    return int(exc.value.code or 0), captured.out, captured.err


def test_tune_picks_the_k_a_brute_force_sweep_finds_fastest(capsys, noisy_pair, spec_file):
    code, out, err = run_tune(
        capsys,
        str(spec_file),
        "--prompts",
        str(spec_file.parent / "prompts.txt"),
        "--costs",
        str(spec_file.parent / "costs.json"),
        "--k-max",
        "8",
        "--max-tokens",
        str(MAX_TOKENS),
        "--n-prompts",
        "4",
        "--json",
    )
    assert code == 0, err
    result = json.loads(out)
    cost, steps = brute_force(noisy_pair, [p.replace("\n", " ") for p in PROMPTS], range(1, 9))
    fastest = min(cost, key=cost.get)
    assert result["k"] == fastest, (result["k"], cost)
    assert 1 < fastest < 8, cost  # the costs make the sweep's answer non-trivial
    # the exact simulation predicts the decoder's step count at every K
    for row in result["rows"]:
        assert row["steps"] == steps[row["k"]], (row, steps)
    assert "max_draft_len: 1" in result["diff"] and f"max_draft_len: {fastest}" in result["diff"]
    assert spec_file.read_text().count("max_draft_len: 1  # K: draft tokens") == 1  # not written without --write


def test_tune_write_keeps_comments_and_layout(capsys, spec_file):
    code, out, err = run_tune(
        capsys,
        str(spec_file),
        "--prompts",
        str(spec_file.parent / "prompts.txt"),
        "--costs",
        str(spec_file.parent / "costs.json"),
        "--k-max",
        "4",
        "--max-tokens",
        "16",
        "--n-prompts",
        "2",
        "--write",
    )
    assert code == 0, err
    text = spec_file.read_text()
    assert text.startswith("# tuned by the test\n") and "  # K: draft tokens" in text
    from trtspec.spec import load_spec

    spec = load_spec(spec_file)
    assert 1 <= spec.speculative.max_draft_len <= 4 and "wrote" in out


def test_set_section_values_edits_in_place_adds_missing_keys_and_sections():
    text = "a: 1\nspeculative:\n  max_draft_len: 4  # K\n\nengine:\n  x: 1\n"
    new = set_section_values(text, "speculative", {"max_draft_len": 6, "route_threshold": 32})
    assert new == "a: 1\nspeculative:\n  max_draft_len: 6  # K\n  route_threshold: 32\n\nengine:\n  x: 1\n"
    assert (
        set_section_values("a: 1\n", "speculative", {"max_draft_len": 2}) == "a: 1\nspeculative:\n  max_draft_len: 2\n"
    )


@pytest.mark.parametrize(
    "args, message",
    [(["--k-max", "17"], "--k-max 17"), (["--write"], "--write needs"), (["--n-prompts", "0"], "--n-prompts")],
)
def test_tune_bad_input_is_one_line(capsys, args, message):
    code, _, err = run_tune(capsys, *args)
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 1 and message in lines[0] and lines[1].startswith("hint:")


def test_tune_ngram_simulates_the_decoder_s_n_gram_steps_exactly(capsys, spec_file):
    """drafter ngram (prompt lookup: the tiny draft has no pool) runs through the decoder's in-flight engine: the
    exact simulation of the n-gram's proposals predicts the decoder's step count at every K."""
    text = spec_file.read_text().replace("  route_threshold: 0\n", "  route_threshold: 0\n  drafter: ngram\n")
    spec_file.write_text(text)
    code, out, err = run_tune(
        capsys,
        str(spec_file),
        "--prompts",
        str(spec_file.parent / "prompts.txt"),
        "--costs",
        str(spec_file.parent / "costs.json"),
        "--k-max",
        "4",
        "--max-tokens",
        str(MAX_TOKENS),
        "--n-prompts",
        "4",
        "--json",
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["drafter"] == "ngram"
    from trtspec.runtimes.torch.decoder import SpeculativeDecoder
    from trtspec.runtimes.torch.session import TorchSession
    from trtspec.spec import load_spec

    session = TorchSession.from_spec(load_spec(spec_file))
    assert session.draft is None and session.decoder.drafter.value == "ngram"
    dec: SpeculativeDecoder = session.decoder
    from trtspec.prompts import encode_prompt

    ids = [encode_prompt(session.tokenizer, p.replace("\n", " ")) for p in PROMPTS]
    reference = [r.token_ids for r in dec.generate(ids, MAX_TOKENS, use_draft=False)]
    for row in result["rows"]:
        runs = [dec.generate([p], MAX_TOKENS, num_draft_tokens=row["k"])[0] for p in ids]
        assert [r.token_ids for r in runs] == reference
        assert row["steps"] == sum(r.stats.target_steps for r in runs), row


def test_tune_on_the_workload_set_takes_every_category_in_turn(capsys, spec_file):
    from trtspec.prompts import WORKLOAD_CATEGORIES, workloads
    from trtspec.tune import workload_prompts

    sets = workloads()
    six = workload_prompts(6)
    assert [next(c for c in WORKLOAD_CATEGORIES if p in sets[c]) for p in six] == list(WORKLOAD_CATEGORIES)
    code, out, err = run_tune(
        capsys,
        str(spec_file),
        "--workloads",
        "--costs",
        str(spec_file.parent / "costs.json"),
        "--k-max",
        "4",
        "--max-tokens",
        "8",
        "--n-prompts",
        "6",
        "--json",
    )
    assert code == 0, err
    result = json.loads(out)
    assert 1 <= result["k"] <= 4 and [r["k"] for r in result["rows"]] == [1, 2, 3, 4]
    code, _, err = run_tune(capsys, str(spec_file), "--workloads", "--url", "localhost:8001")
    assert code == 1 and "--workloads takes neither" in err


def test_tune_adaptive_replays_the_policy_and_bounds_it(capsys, spec_file):
    """drafter adaptive has no fixed rule: tune replays its policy on the target's answers for every K (and the
    best measured K is still the decoder's), and says how far the least-cost decode of any per-step choice lies."""
    text = spec_file.read_text().replace("  drafter: model\n", "  drafter: adaptive\n")
    spec_file.write_text(text)
    code, out, err = run_tune(
        capsys, str(spec_file), "--prompts", str(spec_file.parent / "prompts.txt"), "--costs",
        str(spec_file.parent / "costs.json"), "--k-max", "4", "--max-tokens", str(MAX_TOKENS), "--n-prompts", "4",
        "--json",
    )  # fmt: skip
    assert code == 0, err
    result = json.loads(out)
    assert result["drafter"] == "adaptive" and [r["k"] for r in result["rows"]] == [1, 2, 3, 4]
    assert all(r["steps"] >= 4 and r["predicted_speedup"] > 0 for r in result["rows"])
    (note,) = [n for n in result["notes"] if "least-cost" in n]
    bound = float(note.split("would be ")[1].split("x")[0])
    assert bound >= max(r["predicted_speedup"] for r in result["rows"]) - 0.01
