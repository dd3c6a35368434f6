"""GetCapacity's credentials: the Secret a StorageClass names for the provisioner, when the class
fixes it (a claim template cannot be filled: no capacity, and an error saying why). Values are
never logged. Design: docs/design/sidecars.md.
"""
from __future__ import annotations

from collections.abc import Mapping

from cephcsi.ceph.credentials import Credentials
from cephcsi.errors import FailedPrecondition, InvalidArgument
from cephcsi.sidecars.api import KubeApi
from cephcsi.sidecars.provisioner import secrets


class KubeCapacitySecrets:
    """csi.capacity.CapacitySecrets through the Kubernetes API."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    def credentials_for(self, parameters: Mapping[str, str]) -> Credentials:
        name_key = secrets.name_key(secrets.PROVISIONER)
        if "$" in parameters.get(name_key, "") + parameters.get(secrets.namespace_key(secrets.PROVISIONER), ""):
            raise FailedPrecondition(
                f"the StorageClass's provisioner secret ({name_key}) is a template filled in per claim, so its "
                "capacity cannot be read without one; name a fixed Secret to get CSIStorageCapacity objects")
        try:
            ref = secrets.secret_ref(secrets.PROVISIONER, parameters, "", None)
        except InvalidArgument as error:
            raise InvalidArgument(f"StorageClass: {error.message}") from None
        if ref is None:
            raise FailedPrecondition(
                f"the StorageClass names no provisioner secret ({name_key} and "
                f"{secrets.namespace_key(secrets.PROVISIONER)}): there are no credentials to read its pool with")
        return Credentials.from_secrets(self.api.read_secret(ref.namespace, ref.name))
