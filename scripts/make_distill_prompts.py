"""Write trtspec/data/distill_prompts.jsonl: the prompts `trtspec distill` asks the target to answer.

Instruction prompts (templates x topics) and the workload categories' prompts (scripts/distill_categories.py:
multi-turn chat, summarization, retrieval-grounded QA, translation, math word problems, code edits), one JSON object
per line ({"category", "prompt"} or {"category", "messages"}), written for this project (no network, no third-party
text), deterministic: the same script writes the same file. The questions of benchmarks/speculative_cpu.py and
tests/test_example_speculative.py are excluded, so measured acceptance on them is held-out.

    python scripts/make_distill_prompts.py
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distill_categories import category_prompts  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "trtspec" / "data" / "distill_prompts.jsonl"

THINGS = [
    "a bicycle",
    "photosynthesis",
    "a compiler",
    "the stock market",
    "a vaccine",
    "a rainbow",
    "a refrigerator",
    "the internet",
    "a democracy",
    "gravity",
    "a neural network",
    "ocean tides",
    "a volcano",
    "inflation",
    "a car engine",
    "sleep",
    "a solar panel",
    "a credit card",
    "the water cycle",
    "a microwave oven",
    "a search engine",
    "an earthquake",
    "a battery",
    "the immune system",
    "a hash table",
    "a blockchain",
    "a thermostat",
    "GPS",
    "a jet engine",
    "evolution",
    "a password manager",
    "a heat pump",
    "a camera lens",
    "the human heart",
    "a wind turbine",
    "compound interest",
    "a database index",
    "a telescope",
    "recycling",
    "a nuclear reactor",
    "Wi-Fi",
    "a language model",
    "the moon's phases",
    "an electric guitar",
    "coffee roasting",
    "a sourdough starter",
    "a spreadsheet",
    "an operating system",
    "a bee colony",
    "the seasons",
]
SKILLS = [
    "learning to play the piano",
    "running a first marathon",
    "saving money on groceries",
    "public speaking",
    "starting a vegetable garden",
    "writing a resume",
    "learning to code",
    "keeping a houseplant alive",
    "studying for an exam",
    "cooking rice",
    "training a puppy",
    "staying focused while working from home",
    "making new friends in a new city",
    "learning to draw",
    "reducing screen time",
    "planning a road trip",
    "negotiating a salary",
    "improving handwriting",
    "sleeping better",
    "learning to swim",
    "organizing a small closet",
    "preparing for a job interview",
    "meditating",
    "baking bread",
    "reading more books",
    "taking better photos with a phone",
    "learning to juggle",
    "keeping a journal",
]
CODE_TASKS = [
    "reverses a string",
    "counts the vowels in a sentence",
    "returns the n-th Fibonacci number",
    "merges two sorted lists",
    "removes duplicates from a list while keeping order",
    "checks whether a string is a palindrome",
    "computes the factorial of a number",
    "finds the largest element in a list",
    "converts Celsius to Fahrenheit",
    "sums the digits of an integer",
    "flattens a nested list",
    "counts word frequencies in a text",
    "checks whether two words are anagrams",
    "returns the greatest common divisor of two numbers",
    "reads a CSV file and prints each row",
    "sorts a list of dictionaries by a key",
    "computes the average of a list of numbers",
    "validates an email address with a regular expression",
    "implements binary search",
    "finds all even numbers in a list",
    "capitalizes every word in a sentence",
    "generates a random password",
    "transposes a matrix",
    "checks whether a year is a leap year",
]
LANGS = ["Python", "JavaScript", "C", "Rust", "Go", "Java", "SQL", "Bash"]
PAIRS = [
    ("cats", "dogs"),
    ("tea", "coffee"),
    ("Python", "JavaScript"),
    ("renting", "buying a home"),
    ("trains", "planes"),
    ("summer", "winter"),
    ("books", "movies"),
    ("a laptop", "a desktop computer"),
    ("running", "swimming"),
    ("solar power", "wind power"),
    ("lists", "tuples in Python"),
    ("email", "instant messaging"),
    ("cities", "the countryside"),
    ("paper books", "e-readers"),
    ("TCP", "UDP"),
    ("stocks", "bonds"),
    ("oil paint", "watercolor"),
    ("a violin", "a cello"),
]
SUBJECTS = [
    "the ocean",
    "autumn leaves",
    "a lighthouse",
    "a city at night",
    "a lost key",
    "the first snow",
    "a robot who learns to cook",
    "an old library",
    "a friendly dragon",
    "a train journey",
    "the desert",
    "a garden in spring",
    "a cat on a windowsill",
    "the moon",
    "a rainy Monday",
    "a mountain village",
    "a forgotten letter",
    "a time traveler",
    "a busy kitchen",
    "the last day of school",
]
FACTS = [
    "Who wrote Romeo and Juliet?",
    "What is the largest planet in our solar system?",
    "How many continents are there?",
    "What is the boiling point of water at sea level?",
    "What is the chemical symbol for gold?",
    "Who painted the Mona Lisa?",
    "What is the tallest mountain on Earth?",
    "What language is spoken in Brazil?",
    "How many days are in a leap year?",
    "What is the speed of light?",
    "What is the capital of Japan?",
    "What is the capital of Canada?",
    "What is the capital of Italy?",
    "What is the smallest prime number?",
    "What gas do plants absorb from the air?",
    "How many legs does a spider have?",
    "What is the longest river in Africa?",
    "Who was the first person to walk on the moon?",
    "What is the freezing point of water in Fahrenheit?",
    "What is the square root of 144?",
    "Which planet is known as the Red Planet?",
    "What is the main ingredient of guacamole?",
    "How many bones are in the adult human body?",
    "What year did World War II end?",
    "What is the hardest natural substance?",
    "What is the currency of the United Kingdom?",
    "What does DNA stand for?",
    "What is the largest ocean on Earth?",
    "What is the capital of Australia?",
    "Who invented the telephone?",
]
MATH = [
    "What is 17 times 23?",
    "If a train travels 60 km per hour for 2.5 hours, how far does it go?",
    "A shirt costs $40 and is on sale for 25% off. What is the sale price?",
    "What is 15% of 80?",
    "Solve for x: 3x + 7 = 22.",
    "What is the area of a circle with radius 3?",
    "If I have 3 apples and buy 5 more, then eat 2, how many do I have?",
    "What is 2 to the power of 10?",
    "Convert 5 kilometers to miles.",
    "What is the average of 4, 8, 15, 16, 23 and 42?",
    "How many minutes are there in a week?",
    "What is the perimeter of a rectangle 7 m long and 3 m wide?",
    "Is 91 a prime number?",
    "What is one third plus one quarter?",
    "Simplify the fraction 18/24.",
    "A recipe needs 200 g of flour for 4 people. How much for 6 people?",
]
EXPLAIN = [
    "Explain how {t} works.",
    "How does {t} work? Keep it simple.",
    "Explain {t} to a ten-year-old.",
    "What is {t}, in two or three sentences?",
    "Give a short overview of {t}.",
    "What are the main parts of {t}?",
    "Why is {t} important?",
    "Describe {t} in one paragraph.",
    "What are common misconceptions about {t}?",
    "Write a short quiz with three questions about {t}.",
]
ADVICE = [
    "Give me some tips for {s}.",
    "How should a beginner approach {s}?",
    "What are common mistakes in {s}?",
    "Make a one-week plan for {s}.",
    "I want to get better at {s}. Where do I start?",
    "List five steps for {s}.",
]
CODE = [
    "Write a {l} function that {c}.",
    "Show me how to write code in {l} that {c}.",
    "Write a {l} program that {c}, with a short explanation.",
]
COMPARE = [
    "Compare {a} and {b}.",
    "What are the pros and cons of {a} versus {b}?",
    "Which is better, {a} or {b}? Explain briefly.",
]
CREATIVE = [
    "Write a short poem about {x}.",
    "Write a haiku about {x}.",
    "Write a four-line rhyme about {x}.",
    "Tell me a short story about {x}.",
    "Describe {x} in vivid detail.",
    "Write a limerick about {x}.",
]
TASKS = [
    "Write a polite email asking my manager for a day off next Friday.",
    "Write a thank-you note to a friend who helped me move.",
    "Summarize the plot of Cinderella in three sentences.",
    "Give me a recipe for a simple tomato pasta.",
    "Suggest five names for a new coffee shop.",
    "Write a product description for a reusable water bottle.",
    "Draft a short birthday message for my sister.",
    "What should I pack for a weekend camping trip?",
    "Plan a healthy breakfast for a busy morning.",
    "Write a short introduction about yourself for a new team.",
    "Give me three ideas for a rainy afternoon.",
    "Write a tweet announcing a new bakery opening.",
    "How do I politely decline an invitation?",
    "Translate 'Good morning, how are you?' into Spanish and French.",
    "Give me a fun fact about octopuses.",
    "What is the difference between weather and climate?",
    "Why do we have leap years?",
    "What is machine learning?",
    "What is the meaning of the word 'ephemeral'?",
    "Correct the grammar: 'She don't like apples and he go to school every days.'",
    "Rewrite this sentence to be more formal: 'Hey, can you send me that thing?'",
    "What are the health benefits of drinking water?",
    "How can I reduce stress before an exam?",
    "Explain the difference between a virus and a bacterium.",
    "What causes thunder?",
    "Hello! Who are you?",
    "Can you help me with my homework?",
    "Tell me a joke.",
    "What can you do?",
    "Thank you for your help!",
    "What is your favorite book?",
    "Good morning!",
]
EXCLUDED = {
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "Explain why the sky is blue in two sentences.",
    "Give me three tips for learning a new language.",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime.",
    "Hi",
}


def prompts() -> list[str]:
    """Every prompt, shuffled with a fixed seed (the distiller splits train/held-out by a hash, not by order)."""
    rng = random.Random(7)
    out = set(FACTS + MATH + TASKS)
    for t in THINGS:
        out.update(rng.sample([e.format(t=t) for e in EXPLAIN], 4))
    for s in SKILLS:
        out.update(rng.sample([a.format(s=s) for a in ADVICE], 3))
    for c in CODE_TASKS:
        out.update(CODE[i].format(l=lang, c=c) for i, lang in enumerate(rng.sample(LANGS, 3)))
    for a, b in PAIRS:
        out.update(c.format(a=a, b=b) for c in COMPARE)
    for x in SUBJECTS:
        out.update(rng.sample([c.format(x=x) for c in CREATIVE], 3))
    ordered = sorted(out - EXCLUDED)
    rng.shuffle(ordered)
    return ordered


def instruction_category(prompt: str) -> str:
    if prompt in MATH:
        return "math"
    code = {CODE[i].format(l=lang, c=c) for c in CODE_TASKS for lang in LANGS for i in range(len(CODE))}
    return "code" if prompt in code else "instruction"


def records() -> list[dict[str, Any]]:
    """The instruction prompts (in :func:`prompts`' order) and then the categories' prompts, shuffled together."""
    out: list[dict[str, Any]] = [{"category": instruction_category(p), "prompt": p} for p in prompts()]
    out += category_prompts(THINGS, SKILLS)
    random.Random(13).shuffle(out)
    return out


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r, ensure_ascii=False) for r in records()]
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines)} prompts to {OUT}")


if __name__ == "__main__":
    main()
