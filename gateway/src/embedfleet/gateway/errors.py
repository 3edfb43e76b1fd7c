"""Errors in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with a status."""

from __future__ import annotations

import orjson


class ApiError(Exception):
    """An error the client should see; everything else is a 500 with no detail."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> bytes:
        return orjson.dumps(
            {
                "error": {
                    "message": self.message,
                    "type": self.type,
                    "param": self.param,
                    "code": self.code,
                }
            }
        )


def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def too_large(message: str, param: str | None = None) -> ApiError:
    return ApiError(413, message, param=param, code="request_too_large")


def not_found(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(404, message, param=param, code=code)


def not_allowed(message: str, allow: bytes) -> ApiError:
    return ApiError(405, message, code="method_not_allowed", headers=((b"allow", allow),))


def overloaded(
    retry_after: int, message: str = "All workers are saturated; retry later."
) -> ApiError:
    return ApiError(
        429,
        message,
        type="rate_limit_error",
        code="overloaded",
        headers=((b"retry-after", str(retry_after).encode()),),
    )


def unauthorized(presented: bool) -> ApiError:
    """OpenAI's answer to a missing or wrong key (the key itself is never echoed)."""
    message = (
        "Incorrect API key provided."
        if presented
        else "You didn't provide an API key. Pass it as 'Authorization: Bearer <key>'."
    )
    return ApiError(
        401, message, code="invalid_api_key", headers=((b"www-authenticate", b"Bearer"),)
    )


def unavailable(message: str) -> ApiError:
    return ApiError(503, message, type="server_error", code="no_workers")


def internal() -> ApiError:
    return ApiError(500, "Internal server error.", type="server_error", code="internal_error")
