"""The calculator as an environment (TRL's ``environment_factory``, ``task.environment: calculator_env:Calculator``):
each rollout gets an instance, reset with its data row; its public methods are the tools; ``get_reward`` scores the
rollout from what happened in it (here: whether the last product it computed is the answer)."""


class Calculator:
    def reset(self, **row):
        """Before each rollout: the row's fields (prompt, answer, other columns). Returns text to append to the
        prompt, or None."""
        self.answer, self.last = int(row["answer"]), None
        return None

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        self.last = a * b
        return self.last

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first term.
            b: The second term.
        """
        self.last = a + b
        return self.last

    def get_reward(self) -> float:
        return 1.0 if self.last == self.answer else 0.0
