from typing import Any

class OpenApiException(Exception): ...

class ApiException(OpenApiException):
    status: int | None
    reason: str | None
    body: str | bytes | None
    headers: Any
    def __init__(self, status: int | None = None, reason: str | None = None, http_resp: Any = None) -> None: ...

def __getattr__(name: str) -> Any: ...
