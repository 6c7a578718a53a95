"""The example's tools: plain Python functions with type hints and a Google-style docstring, as TRL's
``GRPOTrainer(tools=[...])`` takes them (transformers reads their schema from both)."""


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first term.
        b: The second term.
    """
    return a + b
