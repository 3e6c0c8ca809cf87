"""API errors: ``{"error": {"code", "message"}}`` with constant messages.

A message never echoes a token, secret, URL or ID; a 422 names the field.
"""

from __future__ import annotations

from starlette.responses import JSONResponse


class ApiError(Exception):
    """An error answer. ``message`` must be constant text (field names allowed)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def response(self) -> JSONResponse:
        return error_response(self.status, self.code, self.message)


def error_response(status: int, code: str, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": {"code": code, "message": message}}, status, headers=headers)


def bad_json() -> ApiError:
    return ApiError(400, "bad_json", "the body is not valid JSON")


def invalid(field: str, problem: str) -> ApiError:
    return ApiError(422, "invalid", f"{field}: {problem}")


def only_field(body: object, name: str) -> object:
    """The value of ``name`` in a body that must be an object with exactly that field.

    Raises the 422 that names what is wrong: not an object, an unknown field,
    the field missing.
    """
    if not isinstance(body, dict):
        raise invalid("(body)", "expected an object")
    if set(body) - {name}:
        raise invalid("(body)", "unknown field")
    if body.get(name) is None:
        raise invalid(name, "required")
    return body[name]


def too_large(message: str = "the request body is too large") -> ApiError:
    return ApiError(413, "too_large", message)


def body_timeout() -> ApiError:
    return ApiError(408, "body_timeout", "the request body did not arrive in time")


def thread_not_found() -> ApiError:
    """The same answer for a thread that does not exist and one the caller cannot
    read, so the answer never tells whether a thread exists."""
    return ApiError(404, "not_found", "no such thread")


RETRY_AFTER_UNAVAILABLE = "2"
"""Seconds a client is asked to wait after a 503 (the database is being reconnected)."""


def unavailable() -> JSONResponse:
    """503 ``unavailable``: the database cannot be reached right now; try again later."""
    response = error_response(503, "unavailable", "the service is unavailable; try again later")
    response.headers["Retry-After"] = RETRY_AFTER_UNAVAILABLE
    return response
