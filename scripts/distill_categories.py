"""The workload categories' prompts of the distillation set (scripts/make_distill_prompts.py writes them beside the
instruction prompts): multi-turn chat, summarization, retrieval-grounded QA, translation, math word problems and code
edits, so that the draft learns the target's answers on the categories `trtspec tune --workloads` and
benchmarks/workloads_cpu.py measure (the workload set itself, trtspec/data/workloads.jsonl, is never trained on).

Written for this project (Apache-2.0): the passages, conversations and code come from trtspec's own hand-written
calibration texts (scripts/corpus/handwritten.txt); the sentences to translate and the word problems are written here.
Deterministic: the same seed gives the same prompts.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parent / "corpus" / "handwritten.txt"

SUMMARIZE = [
    "Summarize the following passage in two sentences.\n\n{p}",
    "Give a one-sentence summary of this text.\n\n{p}",
    "Summarize this paragraph for a busy reader.\n\n{p}",
    "List the three main points of the passage below.\n\n{p}",
    "Rewrite this passage in simpler words, keeping it short.\n\n{p}",
    "Write a short title and a two-sentence summary for this text.\n\n{p}",
]
GROUNDED = [
    "Answer the question using only the context.\n\nContext: {p}\n\nQuestion: {q}",
    "Use the context to answer the question.\n\nContext: {p}\n\nQuestion: {q}",
    "Read the context and answer the question in a few sentences.\n\nContext: {p}\n\nQuestion: {q}",
    "Based only on the passage below, answer the question.\n\nPassage: {p}\n\nQuestion: {q}",
]
QUESTIONS = [
    "What is the main idea of the context?",
    "What example does the context give, and what does it show?",
    "According to the context, why does this matter?",
    "What problem does the context describe?",
    "Which details in the context would surprise a beginner?",
    "What does the context say happens first, and what happens next?",
    "Is there anything the context says is commonly misunderstood? Explain.",
]
SENTENCES = [
    "The museum opens at ten in the morning and closes at six in the evening.",
    "My brother is learning to play the guitar, and he practices every evening.",
    "Could you tell me how to get to the nearest pharmacy?",
    "We booked a small hotel near the beach for the first week of August.",
    "The meeting has been moved to Thursday because the manager is ill.",
    "I forgot my umbrella at home, so I got completely wet on the way to work.",
    "This soup needs more salt, but the bread is delicious.",
    "Our neighbors have two cats and a very old dog.",
    "Please send me the report before Friday afternoon.",
    "The children played in the garden until it started to rain.",
    "How much does a ticket to the concert cost?",
    "She has lived in this city for twelve years and still loves it.",
    "The library is closed on Sundays and on public holidays.",
    "I would like to reserve a table for four people at eight o'clock.",
    "The train was late again, so we missed the beginning of the film.",
    "He drinks a glass of water every morning before breakfast.",
    "The new bridge will connect the two halves of the town.",
    "Can you recommend a good book for a long flight?",
    "We need to buy eggs, milk, flour and some fresh fruit.",
    "The doctor said that I should walk for thirty minutes every day.",
    "It is very cold in the mountains at night, even in summer.",
    "My phone battery is almost empty; may I use your charger?",
    "The students finished their project a week early.",
    "Turn left at the church and the bakery is on your right.",
    "I am sorry, but I do not understand the question.",
    "The garden is full of flowers in the spring.",
    "They moved to a bigger apartment after their daughter was born.",
    "The shop on the corner sells the best coffee in the neighborhood.",
    "Remember to switch off the lights when you leave the office.",
    "Last year we visited my grandparents in a small village by the sea.",
]
LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese"]
TRANSLATE = [
    "Translate into {lang}: {s}",
    "Translate this sentence into {lang}.\n\n{s}",
    "How do you say this in {lang}? {s}",
]
INTO_ENGLISH = [
    "Bonjour, je voudrais un billet pour Lyon, s'il vous plaît.",
    "Il fait très chaud aujourd'hui, nous allons à la plage.",
    "Nous avons mangé dans un petit restaurant près de la gare.",
    "¿Dónde está el museo? Quiero ver los cuadros de Goya.",
    "Mi hermana trabaja en un hospital en Barcelona.",
    "Mañana vamos a visitar a nuestros abuelos en el campo.",
    "Ich habe heute keine Zeit, weil ich arbeiten muss.",
    "Das Wetter ist schön, wir gehen im Park spazieren.",
    "Kannst du mir bitte das Salz geben?",
    "Questa pizza è buonissima, grazie mille.",
    "Eu gosto muito de ler livros antes de dormir.",
    "O ônibus para o centro passa a cada quinze minutos.",
]
WORD_PROBLEMS = [
    "A bakery sells {a} loaves of bread each morning and {b} each afternoon. How many loaves does it sell in {c} days?",
    "Anna has ${a}. She buys a book for ${b} and a pen for ${c}. How much money does she have left?",
    "A car uses {c} liters of fuel per 100 kilometers. How much fuel does it need for {a}0 kilometers?",
    "A class has {a} students. Each student needs {c} notebooks, and notebooks come in packs of {d}. How many packs "
    "are needed?",
    "A rectangle is {a} cm long and {c} cm wide. What are its area and its perimeter?",
    "A train leaves at 9:{b:02d} and the trip takes {c} hours and {d} minutes. When does it arrive?",
    "A jacket costs ${a}0 and is sold at {e}% off. What is the sale price?",
    "Sam reads {c} pages on Monday, twice as many on Tuesday and {d} more on Wednesday. How many pages did he read?",
    "A farmer has {a} chickens and {b} cows. How many legs do the animals have in total?",
    "A tank holds {a}0 liters and is filled at {c} liters per minute. How long does it take to fill from empty?",
    "Maria saves ${c} each week. How many weeks does she need to save ${a}0?",
    "A pizza is cut into {d} equal slices. Three friends eat {c} slices each. What fraction of the pizza is left?",
]
WORD_SUFFIX = ["Explain step by step.", "Show your reasoning.", "Solve step by step.", "Think it through briefly."]
# Short multi-turn openings: (user, assistant, user) over a topic ({t}: a thing, {s}: a skill).
CHATS = [
    (
        "Can you explain {t}?",
        "Of course. Would you like a quick overview or a more detailed explanation?",
        "A quick overview, please, with one everyday example.",
    ),
    (
        "I keep hearing about {t}. What is it?",
        "It comes up a lot. Do you want the basic idea or how it works inside?",
        "The basic idea first. Then tell me one thing most people get wrong about it.",
    ),
    (
        "My friend asked me about {t} and I didn't know what to say.",
        "No problem, I can help you explain it. How much does your friend already know?",
        "Almost nothing. How would you explain it to them in a few sentences?",
    ),
    (
        "I want to get better at {s}.",
        "That's a great goal. What have you tried so far?",
        "Not much yet. Where should I start, and what should I do in the first week?",
    ),
    (
        "I've been struggling with {s}.",
        "I'm sorry to hear that. What part is the hardest for you?",
        "Staying consistent. Can you give me a simple plan I can follow?",
    ),
    (
        "Do you have advice on {s}?",
        "Sure. Are you a complete beginner, or have you done some already?",
        "A complete beginner. What are the three most important things to know?",
    ),
]
CODE_EDITS = [
    "Here is some code:\n\n{c}\n\nExplain what it does in a few sentences.",
    "Here is a function:\n\n{c}\n\nAdd a short docstring and type hints where they are missing.",
    "Review this code and suggest one improvement.\n\n{c}",
    "Here is some code:\n\n{c}\n\nWrite a unit test for it.",
]


def documents() -> list[tuple[str, str]]:
    """(kind, body) of every hand-written calibration document."""
    text = CORPUS.read_text(encoding="utf-8")
    out = []
    for doc in text.split("\n=====\n")[1:]:
        head, _, body = doc.strip().partition("\n")
        if head.startswith("kind: "):
            out.append((head[len("kind: ") :], body.strip()))
    return out


def passages(prose: list[str]) -> list[str]:
    """Two passages of three to five consecutive sentences from every prose document."""
    out = []
    for body in prose:
        sentences = re.split(r"(?<=[.!?])\s+", " ".join(body.split()))
        half = len(sentences) // 2
        for part in (sentences[:half], sentences[half:]):
            if len(part) >= 3:
                out.append(" ".join(part[:5]))
    return out


def conversations(dialogues: list[str]) -> list[list[dict[str, str]]]:
    """Every prefix of a dialogue that ends with a user turn after at least one assistant turn."""
    out = []
    for body in dialogues:
        turns: list[dict[str, str]] = []
        for line in body.splitlines():
            role, sep, content = line.partition(": ")
            if sep and role in ("User", "Assistant"):
                turns.append({"role": role.lower(), "content": content.strip()})
            elif turns and line.strip():
                turns[-1]["content"] += "\n" + line.strip()
        for i, turn in enumerate(turns):
            if turn["role"] == "user" and i >= 2 and turns[i - 1]["role"] == "assistant":
                out.append([dict(t) for t in turns[: i + 1]])
    return out


def snippets(code: list[str]) -> list[str]:
    """The first function of every code document (up to 20 lines)."""
    out = []
    for body in code:
        lines = body.splitlines()
        starts = [
            i for i, line in enumerate(lines) if re.match(r"(def |fn |func |function |int |static |class )", line)
        ]
        if starts:
            block = lines[starts[0] : starts[0] + 20]
            end = next((j for j in range(1, len(block)) if block[j] and not block[j][0].isspace()), len(block))
            out.append("\n".join(block[:end]).rstrip())
    return out


def openings(things: list[str], skills: list[str], rng: random.Random) -> list[list[dict[str, str]]]:
    """Two-turn conversations from :data:`CHATS` over ``things`` and ``skills`` (each topic in one template)."""
    out = []
    for topic, key in [(t, "t") for t in things] + [(s, "s") for s in skills]:
        template = rng.choice([c for c in CHATS if "{" + key + "}" in c[0] + c[2]])
        user, reply, follow = (x.format(**{key: topic}) for x in template)
        out.append(
            [
                {"role": "user", "content": user},
                {"role": "assistant", "content": reply},
                {"role": "user", "content": follow},
            ]
        )
    return out


def category_prompts(things: list[str], skills: list[str], seed: int = 11) -> list[dict[str, Any]]:
    """Every category prompt as a JSONL object: {"category", "prompt"} or {"category", "messages"}."""
    rng = random.Random(seed)
    docs = documents()
    prose = [b for k, b in docs if k == "prose"]
    out: list[dict[str, Any]] = []
    for p in passages(prose):
        out += [{"category": "summarization", "prompt": t.format(p=p)} for t in rng.sample(SUMMARIZE, 2)]
        out += [{"category": "rag", "prompt": rng.choice(GROUNDED).format(p=p, q=q)} for q in rng.sample(QUESTIONS, 2)]
    chats = conversations([b for k, b in docs if k == "dialogue"]) + openings(things, skills, rng)
    out += [{"category": "chat", "messages": m} for m in chats]
    for s in SENTENCES:
        out += [
            {"category": "translation", "prompt": rng.choice(TRANSLATE).format(lang=lang, s=s)}
            for lang in rng.sample(LANGUAGES, 2)
        ]
    out += [{"category": "translation", "prompt": f"Translate into English: {s}"} for s in INTO_ENGLISH]
    for template in WORD_PROBLEMS:
        for _ in range(5):
            n = {"a": rng.randint(12, 60), "b": rng.randint(2, 40), "c": rng.randint(2, 9), "d": rng.randint(2, 8)}
            n["e"] = rng.choice([10, 15, 20, 25, 30, 40])
            out.append({"category": "math", "prompt": f"{template.format(**n)} {rng.choice(WORD_SUFFIX)}"})
    for c in snippets([b for k, b in docs if k == "code"]):
        out += [{"category": "code", "prompt": t.format(c=c)} for t in rng.sample(CODE_EDITS, 2)]
    return out
