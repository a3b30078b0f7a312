"""What a request field the server does not act on gets: a 400 naming it, or, when it changes nothing a local
completion generates, a debug line. Never a silent drop of something that would change the answer.
"""

import logging
from collections.abc import Iterable

from pydantic import BaseModel

from exo.api.errors import ApiError

logger = logging.getLogger(__name__)


def unsupported(where: str, what: str, why: str | None = None) -> ApiError:
    """`where: this server does not support <what> (<why>)`, code `unsupported_parameter`, param `where`."""
    reason = f" ({why})" if why else ""
    return ApiError(
        400, f"{where}: this server does not support {what}{reason}", param=where, code="unsupported_parameter"
    )


def log_ignored(request: BaseModel, ignored_fields: Iterable[str]) -> None:
    """Note (at debug level) which of the accepted-but-ignored fields `request` carried."""
    present = [name for name in ignored_fields if name in request.model_fields_set]
    if present:
        logger.debug("ignoring request fields %s", ", ".join(present))
