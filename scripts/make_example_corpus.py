"""Writes tests/fixtures/examples/corpus.txt: 60 paragraphs of sentences from a fixed toy grammar, the
corpus of the train_gpt smoke test (generated, so the fixture holds no third-party text).
Run: /usr/bin/python3 scripts/make_example_corpus.py"""
import pathlib
import random

random.seed(7)
subjects = ["the cat", "a small dog", "the old sailor", "my neighbour", "the river", "a quiet student", "the machine", "every bird"]
verbs = ["watches", "follows", "remembers", "forgets", "carries", "finds", "answers", "builds"]
objects = ["the moon", "a red kite", "the long road", "an empty box", "the last train", "a warm loaf", "the open window", "a paper map"]
tails = ["at dawn.", "before the rain.", "without a word.", "in the garden.", "after supper.", "on Tuesday.", "with great care.", "again and again."]
paras = []
for p in range(60):
    sents = []
    for s in range(random.randint(2, 5)):
        sents.append(f"{random.choice(subjects).capitalize()} {random.choice(verbs)} {random.choice(objects)} {random.choice(tails)}")
    paras.append(" ".join(sents))
out = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/examples/corpus.txt"
out.write_text("\n\n".join(paras) + "\n")
