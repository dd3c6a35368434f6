# Partial stubs for the kubernetes Python client (no maintained stubs exist for client >= 23).
#
# Only the boundary cephcsi's package crosses is typed: ApiClient and Configuration, the
# exceptions, config loading, and the API methods the package calls. Those are always called
# with `_preload_content=False`, which makes the generated client return the raw
# urllib3 response (the package decodes the JSON itself into plain dicts, cephcsi.kube.store.
# KubeObject); the overloads say exactly that, and calls without it return the generated models,
# typed Any, as is everything these stubs do not name (module and class __getattr__), so tests
# and bench/ can use the rest of the client untyped. Signatures follow the client's generated
# code (kubernetes/client/api/*.py, version 31-34).
from typing import Any

from kubernetes import client as client
from kubernetes import config as config

def __getattr__(name: str) -> Any: ...
