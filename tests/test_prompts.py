"""Prompt sets: files that hold user turns and conversations, a held-out split that new prompts do not move, and
the shipped distillation set covering the workload categories without the workloads themselves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

CHAT = [
    {"role": "user", "content": "Can you explain a compiler?"},
    {"role": "assistant", "content": "Of course. A quick overview or a detailed one?"},
    {"role": "user", "content": "A quick overview, please."},
]


def test_a_jsonl_prompt_file_holds_user_turns_and_conversations(tmp_path: Path):
    from trtspec.prompts import load_prompts

    path = tmp_path / "p.jsonl"
    lines = [{"prompt": "What is 2 + 2?"}, {"text": "Name a color."}, {"category": "chat", "messages": CHAT}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    assert load_prompts(path) == ["What is 2 + 2?", "Name a color.", CHAT]


@pytest.mark.parametrize(
    "line",
    [
        {"messages": CHAT[:2]},  # ends with the assistant: nothing for the target to answer
        {"messages": []},
        {"messages": [{"role": "user"}]},
        {"prompt": ""},
        ["not", "an", "object"],
    ],
)
def test_a_prompt_line_that_is_no_prompt_is_one_error_naming_its_line(tmp_path: Path, line):
    from trtspec.errors import DistillError
    from trtspec.prompts import load_prompts

    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "fine"}) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(DistillError) as exc:
        load_prompts(path)
    assert f"{path}:2:" in str(exc.value) and "\n" not in str(exc.value) and exc.value.hint


def test_adding_prompts_moves_none_of_the_held_out_split():
    from trtspec.prompts import split_prompts

    texts = [f"question number {i}" for i in range(300)]
    conversations = [[*CHAT[:2], {"role": "user", "content": f"follow-up {i}"}] for i in range(100)]
    train, test = split_prompts(texts, 0.1)
    train2, test2 = split_prompts(conversations + texts[::-1], 0.1)
    assert set(test) == {p for p in test2 if isinstance(p, str)} and test  # the old prompts keep their side
    assert set(train) == {p for p in train2 if isinstance(p, str)}
    assert any(not isinstance(p, str) for p in test2) and any(not isinstance(p, str) for p in train2)


def test_the_shipped_set_covers_every_workload_category_but_holds_no_workload():
    from trtspec.prompts import WORKLOAD_CATEGORIES, load_prompts, prompt_key, shipped_prompts, workloads

    rows = [json.loads(line) for line in shipped_prompts().read_text(encoding="utf-8").splitlines()]
    counts = {c: sum(r["category"] == c for r in rows) for c in WORKLOAD_CATEGORIES}
    assert all(n >= 40 for n in counts.values()), counts
    assert all("messages" in r for r in rows if r["category"] == "chat")
    prompts = load_prompts(None)
    assert len(prompts) == len(rows) and len({prompt_key(p) for p in prompts}) == len(prompts)  # no duplicates
    shipped = " ".join(prompt_key(p) for p in prompts)
    for conversations in workloads().values():  # the workload set is what the drafters are measured on
        for messages in conversations:
            for m in messages:
                assert json.dumps(m["content"], ensure_ascii=False)[1:-1] not in shipped, m["content"][:60]
