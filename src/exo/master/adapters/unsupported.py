"""The one 400 for a request feature this server does not have: it names the field, never drops it silently."""

from exo.master.errors import ApiError


def unsupported(where: str, what: str, why: str | None = None) -> ApiError:
    """`where: this server does not support <what> (<why>)`, code `unsupported_parameter`, param `where`."""
    reason = f" ({why})" if why else ""
    return ApiError(
        400, f"{where}: this server does not support {what}{reason}", param=where, code="unsupported_parameter"
    )
