"""The forms in which a model copies conversation text into a tool call, for prompt-lookup drafting.

An agent's edit or write call copies a file the conversation holds, but not verbatim: its arguments are a JSON
string, so every newline becomes ``\\n`` and every quote ``\\"``, and a file shown by a read tool carries line-number
prefixes the copy leaves out. Looked up in the prompt as it is, such a copy stops matching at every line break. These
views give the lookup the text as the call will spell it.
"""

import json
import re
from collections.abc import Sequence

MIN_VIEW_CHARS = 64
"""Shorter texts are not worth a view: a draft from them is a few tokens at most."""

MAX_VIEWS_CHARS = 400_000
"""All views together stay under this (newest texts first): tokenizing and indexing them happens between two decode
steps, and an agent copies from the files it read last."""

_NUMBERED_LINE = re.compile(r"^ *\d+(?:: |\| |\t|→)", re.MULTILINE)
"""A read tool's line prefix: opencode's ``12: `` or ``00012| ``, ``cat -n``'s tab, Claude Code's arrow."""


def without_line_numbers(text: str) -> str | None:
    """`text` with the line-number prefixes a read tool adds taken off, or None when most lines have none."""
    lines = text.splitlines()
    numbered = sum(1 for line in lines if _NUMBERED_LINE.match(line))
    if not lines or numbered * 2 < len(lines):
        return None
    return _NUMBERED_LINE.sub("", text)


def json_string_body(text: str) -> str:
    """`text` as it appears between the quotes of a JSON string (non-ASCII kept, as models write it)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def copy_views(texts: Sequence[str], budget_chars: int = MAX_VIEWS_CHARS) -> list[str]:
    """Every form a copy of one of `texts` may take in a tool call that is not already in the prompt as it stands:
    the text without line numbers, and the JSON-escaped text with and without them. The newest texts (last in
    `texts`) get views first while `budget_chars` lasts; the views keep the texts' order, duplicates dropped.
    """
    chosen: list[list[str]] = []
    spent = 0
    for text in reversed(texts):
        if len(text) < MIN_VIEW_CHARS:
            continue
        plain = without_line_numbers(text)
        candidates = [plain] if plain is not None else []
        candidates += [json_string_body(text)] + ([json_string_body(plain)] if plain is not None else [])
        views = [view for view in candidates if view != text]
        spent += sum(len(view) for view in views)
        if spent > budget_chars:
            break
        chosen.append(views)
    return list(dict.fromkeys(view for views in reversed(chosen) for view in views))
