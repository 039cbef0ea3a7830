"""Regenerate corpus.txt, the small English corpus bundled with the engine.

The text is produced by a seeded template grammar (nothing is downloaded), so it has real
structure for a byte-level model to learn: words, agreement, punctuation, recurring names and
facts. Run from the repository root: ``python distlaunch/data/make_corpus.py``.
"""

from __future__ import annotations

import random
import textwrap
from pathlib import Path

NAMES = [
    "Ada",
    "Brin",
    "Cora",
    "Dev",
    "Elif",
    "Farid",
    "Gao",
    "Hana",
    "Ivo",
    "June",
    "Kofi",
    "Lena",
    "Milo",
    "Nadia",
    "Omar",
    "Pia",
    "Quinn",
    "Rosa",
    "Sami",
    "Tove",
    "Uma",
    "Viktor",
    "Wren",
    "Yusuf",
]
PLACES = [
    "the harbour",
    "the old mill",
    "the library",
    "the market square",
    "the river bank",
    "the hill above the town",
    "the railway station",
    "the bakery on Elm Street",
    "the lighthouse",
    "the school garden",
    "the machine room",
    "the north field",
]
ANIMALS = ["fox", "heron", "badger", "otter", "crow", "goat", "hare", "owl", "cat", "dog"]
OBJECTS = ["lantern", "map", "letter", "kettle", "compass", "notebook", "key", "basket", "clock", "kite"]
ADJS = ["quiet", "bright", "cold", "tired", "curious", "patient", "small", "old", "careful", "happy"]
VERBS_PAST = ["found", "carried", "mended", "painted", "lost", "opened", "hid", "shared", "counted", "watched"]
WEATHER = [
    "It was raining",
    "The sun was low",
    "A wind came from the sea",
    "Snow covered the roofs",
    "Fog rolled over the water",
    "The sky was clear",
]
FEELINGS = ["glad", "worried", "surprised", "calm", "proud", "sleepy"]
TECH = [
    (
        "data parallelism",
        "every worker keeps a full copy of the model and sees a different slice of the batch; "
        "the gradients are averaged with an all-reduce before the optimizer step",
    ),
    (
        "tensor parallelism",
        "a single matrix multiplication is split across devices, so each one holds a part "
        "of the weights and the partial results are summed",
    ),
    (
        "pipeline parallelism",
        "the layers are cut into stages on different devices and micro-batches flow "
        "through them like cars on an assembly line",
    ),
    ("ZeRO stage one", "the optimizer state is partitioned, so each data-parallel rank stores only its share"),
    ("ZeRO stage two", "the gradients are partitioned as well, reduced and scattered instead of all-reduced"),
    ("ZeRO stage three", "even the parameters are partitioned and gathered just before they are used"),
    (
        "a ring all-reduce",
        "each rank sends one chunk to its neighbour and receives another, and after two laps "
        "around the ring every rank holds the sum",
    ),
    ("gradient checkpointing", "activations are thrown away in the forward pass and recomputed during backward"),
]


def sentence(rng: random.Random) -> str:
    """One sentence from a handful of templates."""
    a, b = rng.sample(NAMES, 2)
    kind = rng.randrange(7)
    if kind == 0:
        return f"{a} {rng.choice(VERBS_PAST)} a {rng.choice(ADJS)} {rng.choice(OBJECTS)} near {rng.choice(PLACES)}."
    if kind == 1:
        return f"{rng.choice(WEATHER)}, and {a} felt {rng.choice(FEELINGS)}."
    if kind == 2:
        return f"A {rng.choice(ADJS)} {rng.choice(ANIMALS)} followed {b} to {rng.choice(PLACES)}."
    if kind == 3:
        n = rng.randint(2, 12)
        return f'"There are {n} of them," said {a}, "and we need {n + rng.randint(1, 5)}."'
    if kind == 4:
        topic, fact = rng.choice(TECH)
        return f"{a} explained to {b} that in {topic} {fact}."
    if kind == 5:
        x, y = rng.randint(2, 30), rng.randint(2, 30)
        return f"{b} added {x} and {y} and wrote down {x + y}."
    return f"When the {rng.choice(OBJECTS)} was {rng.choice(['ready', 'gone', 'broken', 'warm'])}, {a} went home."


def paragraph(rng: random.Random) -> str:
    """Four to eight sentences, wrapped at 90 columns."""
    text = " ".join(sentence(rng) for _ in range(rng.randint(4, 8)))
    return textwrap.fill(text, width=90)


def make_corpus(n_bytes: int = 400_000, seed: int = 0) -> str:
    """About ``n_bytes`` of text, the same for the same seed."""
    rng = random.Random(seed)
    parts, size = [], 0
    while size < n_bytes:
        part = paragraph(rng)
        parts.append(part)
        size += len(part) + 2
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    out = Path(__file__).with_name("corpus.txt")
    out.write_text(make_corpus())
    print(f"wrote {out} ({out.stat().st_size} bytes)")
