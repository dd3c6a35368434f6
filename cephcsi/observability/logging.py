"""Structured, leveled logging with a request id carried through each CSI call.

Log records carry fields as `extra={"fields": {...}}`; the text format prints them as
key=value after the message, the JSON format as top-level keys. The request id lives in a
contextvar so Ceph and Kubernetes calls made on behalf of an RPC log it without threading it
through every signature.
"""
from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def new_request_id() -> str:
    return uuid.uuid4().hex[:12]


@contextmanager
def request_scope(request_id: str | None = None) -> Iterator[str]:
    """Bind a request id for the duration of one operation (an RPC, a work-queue item)."""
    rid = request_id or new_request_id()
    token = request_id_var.set(rid)
    try:
        yield rid
    finally:
        request_id_var.reset(token)


def fields(**values: Any) -> dict[str, Any]:
    """`log.info("msg", extra=fields(volume_id=...))`: structured fields for one record."""
    return {"fields": values}


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True


def _record_fields(record: logging.LogRecord) -> Mapping[str, Any]:
    values = getattr(record, "fields", None)
    return values if isinstance(values, Mapping) else {}


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [f"{stamp}.{int(record.msecs):03d}Z", record.levelname[0], record.name, record.getMessage()]
        extras = dict(_record_fields(record))
        rid = getattr(record, "request_id", "")
        if rid:
            extras["req"] = rid
        line = " ".join(parts)
        if extras:
            line += " " + " ".join(f"{k}={_text_value(v)}" for k, v in extras.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _text_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, separators=(",", ":"))
    return json.dumps(text) if (" " in text or not text) else text


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", "")
        if rid:
            doc["req"] = rid
        doc.update(_record_fields(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class _RootHandler(logging.StreamHandler[Any]):
    """The handler `configure` installs, marked so that a later configure replaces it."""

    _cephcsi = True


def configure(level: str = "info", json_format: bool = False, stream: Any = None) -> None:
    """Install one handler on the root logger (idempotent: replaces an earlier one)."""
    handler = _RootHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if json_format else TextFormatter())
    handler.addFilter(_ContextFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_cephcsi", False):
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(LEVELS.get(level, logging.INFO))
    # The kubernetes client logs every request body at DEBUG (secrets included): keep it quiet.
    for noisy in ("kubernetes", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
