"""Test doubles for the node layer: a command runner that records argv instead of running."""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cephcsi.node.exec import CommandFailed, Result, check_argv


@dataclass
class Call:
    argv: list[str]
    what: str
    timeout: float | None
    new_session: bool
    secrets: tuple[str, ...]
    stdin: str | None = None
    files: dict[str, tuple[int, str]] = field(default_factory=dict)
    """For each argv element naming an existing file (or --keyfile=path): (mode, content) at call time."""


Responder = Callable[[list[str]], Result | tuple[int, str, str] | None]


class FakeRunner:
    """Records every call; `respond` returns (rc, stdout, stderr) or None for (0, '', '')."""

    def __init__(self, respond: Responder | None = None) -> None:
        self.calls: list[Call] = []
        self.respond = respond or (lambda argv: None)

    def __call__(
        self,
        argv: Sequence[str],
        *,
        what: str,
        timeout: float | None = None,
        ok_codes: tuple[int, ...] = (0,),
        new_session: bool = False,
        secrets: Sequence[str] = (),
        stdin: str | None = None,
    ) -> Result:
        check_argv(argv)
        call = Call(list(argv), what, timeout, new_session, tuple(secrets), stdin)
        for arg in argv:
            path = arg.split("=", 1)[1] if arg.startswith("--keyfile=") else arg
            if path.startswith("/") and os.path.isfile(path):
                with open(path, encoding="utf-8") as handle:
                    call.files[path] = (os.stat(path).st_mode & 0o777, handle.read())
        self.calls.append(call)
        answer = self.respond(list(argv))
        if answer is None:
            answer = (0, "", "")
        if isinstance(answer, tuple):
            answer = Result(tuple(argv), *answer)
        if answer.returncode not in ok_codes:
            raise CommandFailed(answer, what)
        return answer

    def argvs(self) -> list[list[str]]:
        return [call.argv for call in self.calls]
