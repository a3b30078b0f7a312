"""Prompt-lookup drafting: guess the next tokens by continuing an earlier occurrence of the last few tokens.

A coding agent's tool arguments mostly copy text that is already in the conversation (an edit's old string, a file
being rewritten): once the output starts repeating a passage, the passage's continuation in the prompt is a good
guess for the next tokens. The guesses cost no model: the model checks them all in one forward pass
(`solo.SoloDecoder`), keeping the ones it would have produced itself.
"""

from collections.abc import Sequence

from exo.shared.types.worker.decode_settings import LookupSettings

_AGREEMENT_WINDOW = 64
"""How far back two candidate occurrences are compared with the output before the earlier-indexed one wins."""


class PromptLookup:
    """An index of every n-gram of a request's tokens (prompt, then output) and where it last occurred, and of the
    reference texts: other forms of prompt text the output may copy (`copy_views`), which are not part of the text.

    Each n-gram maps to the position right after its latest occurrence whose continuation is known, so a lookup of
    the current suffix never finds the suffix itself. Appending a token costs one dictionary update per n-gram size.
    Where the suffix occurs both in the text and in a reference, the occurrence preceded by more of the output's own
    recent tokens wins: a copy in progress keeps following the form it is copying.
    """

    def __init__(
        self, tokens: Sequence[int], settings: LookupSettings, references: Sequence[Sequence[int]] = ()
    ) -> None:
        self._settings = settings
        self._tokens: list[int] = []
        self._latest: dict[tuple[int, ...], int] = {}
        self._references = [list(reference) for reference in references]
        self._in_references: dict[tuple[int, ...], tuple[int, int]] = {}
        for index, reference in enumerate(self._references):
            for end in range(1, len(reference)):
                for size in self._ngram_sizes(end):
                    self._in_references[tuple(reference[end - size : end])] = (index, end)
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append `tokens` to the text and index the n-grams they complete."""
        for token in tokens:
            end = len(self._tokens)
            for size in self._ngram_sizes(end):
                self._latest[tuple(self._tokens[end - size : end])] = end
            self._tokens.append(token)

    def _ngram_sizes(self, end: int) -> range:
        """The sizes of the indexed n-grams that fit before position `end`."""
        return range(self._settings.shortest_ngram, min(self._settings.longest_ngram, end) + 1)

    def propose(self, limit: int) -> list[int]:
        """Up to `limit` tokens that followed the latest earlier occurrence of the longest matching suffix."""
        end = len(self._tokens)
        limit = min(limit, self._settings.max_draft_tokens)
        if limit <= 0:
            return []
        for size in range(min(self._settings.longest_ngram, end), self._settings.shortest_ngram - 1, -1):
            suffix = tuple(self._tokens[end - size :])
            in_text = self._latest.get(suffix)
            in_reference = self._in_references.get(suffix)
            if in_reference is not None:
                reference = self._references[in_reference[0]]
                if in_text is None or self._agreement(reference, in_reference[1]) > self._agreement(
                    self._tokens, in_text
                ):
                    return reference[in_reference[1] : in_reference[1] + limit]
            if in_text is not None:
                return self._tokens[in_text : in_text + limit]
        return []

    def _agreement(self, source: list[int], position: int) -> int:
        """How many tokens before `position` in `source` equal the output's last tokens (up to a bound)."""
        end = len(self._tokens)
        count = 0
        while (
            count < _AGREEMENT_WINDOW
            and count < position
            and count < end
            and source[position - 1 - count] == self._tokens[end - 1 - count]
        ):
            count += 1
        return count
