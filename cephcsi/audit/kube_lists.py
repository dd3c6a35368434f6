"""The one way the audit reads the API server: a read-only list, page by page, once.

Shared by the PersistentVolume and VolumeSnapshotContent reads (cephcsi.audit.pvs,
cephcsi.audit.snapshot_contents), which differ only in the call and in how a page carries its
items and continue token (typed objects for core/v1, plain dicts for custom resources).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from cephcsi.kube import apierrors
from cephcsi.kube.client import ClientSettings, ThrottledApiClient, new_api_client

PAGE = 500

Fetch = Callable[[str | None], tuple[Sequence[Any], str | None]]
"""One page: continue token (None for the first) → (items, the next token or None/'' at the end)."""


def api_client(kubeconfig: str) -> ThrottledApiClient:
    # No client-side rate limit: the audit makes a handful of list calls, one after the other.
    return new_api_client(ClientSettings(kubeconfig=kubeconfig, qps=0))


def list_all(fetch: Fetch, what: str) -> Iterator[Any]:
    """Every item of a paged list. Raises cephcsi.kube's ApiError (ApiNotFound for a resource
    the API server does not serve), naming the call as `what`."""
    token: str | None = None
    while True:
        try:
            items, token = fetch(token)
        except Exception as error:  # noqa: BLE001 - every client failure becomes one of ours
            raise apierrors.classify(error, what) from error
        yield from items
        if not token:
            return
