"""A dense, deterministic reward for resume tests: a random tiny model never solves a task
exactly, and all-zero rewards would leave the weights unchanged (zero advantages)."""


def score(prompt: str, completion: str, answer: str) -> float:
    return sum(a == b for a, b in zip(completion, answer)) / max(len(answer), 1) + 0.1 * (len(completion) % 3)
