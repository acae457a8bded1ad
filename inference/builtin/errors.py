"""OpenAI-style errors, spelled as vLLM spells them: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any


class APIError(Exception):
    """A request the server refuses; becomes a JSON error response with `status`."""

    def __init__(
        self,
        message: str,
        status: int = HTTPStatus.BAD_REQUEST,
        type: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = int(status)
        self.type = type or _default_type(self.status)
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.status, self.type, self.param)


def error_body(message: str, status: int, type: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type or _default_type(status), "param": param, "code": status}}


def _default_type(status: int) -> str:
    return {
        HTTPStatus.BAD_REQUEST: "BadRequestError",
        HTTPStatus.NOT_FOUND: "NotFoundError",
        HTTPStatus.UNPROCESSABLE_ENTITY: "BadRequestError",
    }.get(HTTPStatus(status), "InternalServerError")


class ModelNotServedError(APIError):
    def __init__(self, name: str) -> None:
        super().__init__(f"The model `{name}` does not exist.", HTTPStatus.NOT_FOUND, param="model")


class EngineStoppedError(RuntimeError):
    """The generation engine is shutting down and takes no more requests."""
