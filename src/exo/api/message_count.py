"""Refuse a body with more conversation items than any prompt needs, before anything parses it into models.

A body of 100,000 short messages is only 4 MB, well inside the size limit, yet validating it into request models,
adapting it and sending it to the master takes seconds (more under load: on main 0b66627 the master's acceptance
timed out and the client got `503 no_master` after 9 s), and the runner would then template all of it only to find
the prompt too long. The count of `messages` (chat, Messages, Ollama) or `input` items (Responses) is read here with
the C JSON parser, in milliseconds, and only for a body large enough to hold that many items.
"""

import json
from typing import Final, cast

from exo.api.body_text import BodyProblem

DEFAULT_MAX_MESSAGES: Final = 10_000
"""Far beyond a long agent session (a few hundred to a few thousand messages), far below what costs seconds."""
_SMALLEST_ITEM_BYTES: Final = 8
"""No message or input item is shorter than this in JSON (`{"a":1},`): a smaller body cannot hold too many."""
_LISTS: Final = ("messages", "input")


def find_too_many_messages(body: bytes, max_messages: int) -> BodyProblem | None:
    """A problem naming the list when the JSON `body` holds more than `max_messages` items in `messages` or
    `input`; None otherwise (a body that is not JSON is left to the endpoint)."""
    if len(body) <= max_messages * _SMALLEST_ITEM_BYTES:
        return None
    try:
        document: object = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(document, dict):
        return None
    fields = cast(dict[str, object], document)
    for name in _LISTS:
        items = fields.get(name)
        if isinstance(items, list) and len(cast(list[object], items)) > max_messages:
            count = len(cast(list[object], items))
            return BodyProblem(
                f"{name} holds {count} items; a request may hold at most {max_messages} (--max-request-messages)",
                name,
                "too_many_messages",
            )
    return None
