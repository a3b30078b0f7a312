"""Prompt-lookup drafting: guess the next tokens by continuing an earlier occurrence of the last few tokens.

A coding agent's tool arguments mostly copy text that is already in the conversation (an edit's old string, a file
being rewritten): once the output starts repeating a passage, the passage's continuation in the prompt is a good
guess for the next tokens. The guesses cost no model: the model checks them all in one forward pass
(`solo.SoloDecoder`), keeping the ones it would have produced itself.
"""

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LookupSettings:
    """How drafts are found and how long they may be."""

    max_draft_tokens: int = 8
    longest_ngram: int = 4
    shortest_ngram: int = 2
    """An n-gram this short or longer must match before anything is proposed (single tokens match far too often)."""
    adaptive: bool = True
    """Verify a draft only when the measured step costs say it pays (`draft_policy`); False verifies every draft."""


class PromptLookup:
    """An index of every n-gram of a request's tokens (prompt, then output) and where it last occurred.

    Each n-gram maps to the position right after its latest occurrence whose continuation is known, so a lookup of
    the current suffix never finds the suffix itself. Appending a token costs one dictionary update per n-gram size.
    """

    def __init__(self, tokens: Sequence[int], settings: LookupSettings) -> None:
        self._settings = settings
        self._tokens: list[int] = []
        self._latest: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append `tokens` to the text and index the n-grams they complete."""
        for token in tokens:
            end = len(self._tokens)
            for size in range(self._settings.shortest_ngram, min(self._settings.longest_ngram, end) + 1):
                self._latest[tuple(self._tokens[end - size : end])] = end
            self._tokens.append(token)

    def propose(self, limit: int) -> list[int]:
        """Up to `limit` tokens that followed the latest earlier occurrence of the longest matching suffix."""
        end = len(self._tokens)
        limit = min(limit, self._settings.max_draft_tokens)
        if limit <= 0:
            return []
        for size in range(min(self._settings.longest_ngram, end), self._settings.shortest_ngram - 1, -1):
            start = self._latest.get(tuple(self._tokens[end - size :]))
            if start is not None:
                return self._tokens[start : start + limit]
        return []
