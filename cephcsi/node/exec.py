"""The one place the node plugin runs external commands (rbd, rbd-fuse, losetup, mkfs, mount...).

Every command has a timeout (DEADLINE_EXCEEDED), runs with `LC_ALL=C`, is logged with argv and
duration, and never carries a key on argv (refused; `SecretArg` values show as `<redacted>`).
A missing tool is FAILED_PRECONDITION, a non-zero exit `CommandFailed` for callers to refine.
docs/design/node.md, "Running tools".
"""
from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from cephcsi.ceph import cephx_keys
from cephcsi.ceph.credentials import is_cephx_key
from cephcsi.errors import DeadlineExceeded, FailedPrecondition, Internal
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 120.0
_STDERR_TAIL = 600
# Ways the Ceph tools accept a key inline; we always use --keyfile instead.
_INLINE_SECRET_FLAGS = ("--key", "--secret", "--key=", "--secret=")
REDACTED = "<redacted>"


class SecretArg(str):
    """An argv element that is (or holds) a secret: passed to the tool, shown as REDACTED."""

    __slots__ = ()

    def __repr__(self) -> str:
        return REDACTED


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    """As logged: secret elements replaced by REDACTED (see redact)."""
    returncode: int
    stdout: str
    stderr: str


class CommandFailed(Internal):
    """A command exited non-zero; the message names the command and quotes its stderr."""

    def __init__(self, result: Result, what: str) -> None:
        super().__init__(f"{what} failed: `{shlex.join(result.argv)}` exited {result.returncode}: {tail(result.stderr)}")
        self.result = result

    @property
    def returncode(self) -> int:
        return self.result.returncode

    @property
    def stderr(self) -> str:
        return self.result.stderr


def tail(text: str, limit: int = _STDERR_TAIL) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else "..." + text[-limit:]


# Candidates for a cephx key in base64 (40 or 60 characters as Ceph makes them; see
# cephcsi.ceph.cephx_keys), standing alone; is_cephx_key decides.
_KEY_SHAPED = re.compile(r"(?<![A-Za-z0-9+/=])[A-Za-z0-9+/]{38,400}={0,2}(?![A-Za-z0-9+/=])")


def scrub(text: str, secrets: Sequence[str]) -> str:
    """`text` without the given secrets in any form a tool could print them (a cephx key also as
    re-encoded, its secret alone in base64 and hex: cephx_keys.forms) and without anything else
    that decodes as a cephx key (a tool may print one we did not give it, e.g. from a keyring)."""
    forms = {form for secret in secrets if secret for form in cephx_keys.forms(secret)}
    for form in sorted(forms, key=len, reverse=True):  # a longer form first: it may contain a shorter
        text = text.replace(form, "***")
    return _KEY_SHAPED.sub(lambda m: "***" if is_cephx_key(m.group()) else m.group(), text)


def redact(argv: Sequence[str], secrets: Sequence[str] = ()) -> tuple[str, ...]:
    """argv as it may be shown: an element marked SecretArg, or containing one of `secrets` (also
    as `--flag=<secret>`), becomes REDACTED."""
    hidden = [secret for secret in secrets if secret]
    return tuple(REDACTED if isinstance(arg, SecretArg) or any(secret in arg for secret in hidden) else str(arg)
                 for arg in argv)


def check_argv(argv: Sequence[str]) -> None:
    """Refuse argv that would put a secret into /proc/*/cmdline."""
    for arg in argv:
        if arg in _INLINE_SECRET_FLAGS[:2] or arg.startswith(_INLINE_SECRET_FLAGS[2:]):
            raise ValueError(f"refusing to run {argv[0]} with an inline key ({arg.split('=')[0]}); use a key file")


class Runner(Protocol):
    """What mappers, filesystems and mounts need; tests pass a fake that records argv."""

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
    ) -> Result: ...


def run(
    argv: Sequence[str],
    *,
    what: str,
    timeout: float | None = None,
    ok_codes: tuple[int, ...] = (0,),
    new_session: bool = False,
    secrets: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
) -> Result:
    """Run argv and return its result; raise if it exits with a code outside `ok_codes`.

    `what` names the step for error messages ("map image rbd/x", "mount /dev/loop0").
    `new_session` detaches the child from our process group, so a signal aimed at the plugin's
    group does not hit a daemon that must outlive it (rbd-fuse before it daemonizes itself).
    `secrets` are scrubbed from the captured output before it is logged or quoted in an error
    (Ceph tools echo a malformed key back in "failed to decode key '...'").
    `stdin` is written to the child's standard input (a passphrase for `cryptsetup --key-file=-`:
    never argv); list it in `secrets` too so an echo of it is scrubbed.
    An argv element that is a SecretArg or contains one of `secrets` is shown as REDACTED in the
    debug line, the timeout warning, errors and the Result.
    """
    check_argv(argv)
    limit = DEFAULT_TIMEOUT if timeout is None else timeout
    command = tuple(str(arg) for arg in argv)
    shown = redact(argv, secrets)
    # a tool may echo an argument back ("invalid value '...'"): marked ones are scrubbed as secrets
    secrets = (*secrets, *(arg for arg in argv if isinstance(arg, SecretArg)))
    started = time.monotonic()
    child_env = {**os.environ, "LC_ALL": "C", **(env or {})}
    try:
        completed = subprocess.run(
            command,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=limit,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            env=child_env,
            start_new_session=new_session,
            check=False,
        )
    except FileNotFoundError:
        raise FailedPrecondition(f"{what}: {shown[0]} is not installed on this node") from None
    except subprocess.TimeoutExpired:
        log.warning("command timed out", extra=fields(argv=shlex.join(shown), seconds=limit))
        raise DeadlineExceeded(f"{what}: `{shlex.join(shown)}` did not finish within {limit:g}s") from None
    except OSError as error:
        raise Internal(f"{what}: cannot run {shown[0]}: {error.strerror}") from None
    result = Result(shown, completed.returncode, scrub(completed.stdout, secrets), scrub(completed.stderr, secrets))
    elapsed_ms = round((time.monotonic() - started) * 1000, 1)
    log.debug(
        "command",
        extra=fields(argv=shlex.join(shown), rc=result.returncode, ms=elapsed_ms, stderr=tail(result.stderr, 200)),
    )
    if result.returncode not in ok_codes:
        raise CommandFailed(result, what)
    return result
