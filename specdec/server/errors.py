"""Errors in OpenAI's format: {"error": {"message", "type", "param", "code"}}, with an HTTP status."""

from __future__ import annotations


class APIError(Exception):
    """An error the client caused or must know about; its message is shown as is (never a traceback)."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def unsupported(param: str, why: str = "is not supported by this server") -> APIError:
    return APIError(400, f"'{param}' {why}", "invalid_request_error", param, "unsupported_parameter")


def model_not_found(name: str, served: str) -> APIError:
    return APIError(
        404,
        f"The model '{name}' does not exist; this server serves '{served}'",
        "invalid_request_error",
        "model",
        "model_not_found",
    )


def too_large(limit: int) -> APIError:
    return APIError(413, f"The request body is larger than {limit} bytes", code="request_too_large")


def unauthorized() -> APIError:
    return APIError(
        401,
        "Missing or incorrect API key: send 'Authorization: Bearer <key>'",
        "invalid_request_error",
        None,
        "invalid_api_key",
    )


def overloaded(capacity: int, retry_after_s: int = 1) -> APIError:
    return APIError(
        429,
        f"The server is overloaded ({capacity} requests running or queued); retry in about {retry_after_s} s",
        "rate_limit_error",
        None,
        "server_overloaded",
        headers={"Retry-After": str(retry_after_s)},
    )


def shutting_down() -> APIError:
    return APIError(503, "The server is shutting down", "server_error", None, "server_shutting_down")


def internal() -> APIError:
    return APIError(500, "Internal server error (see the server log)", "server_error", None, "internal_error")
