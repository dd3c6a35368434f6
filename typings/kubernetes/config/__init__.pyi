# See kubernetes/__init__.pyi.
from typing import Any

from kubernetes.client import Configuration
from kubernetes.config.config_exception import ConfigException as ConfigException

def load_kube_config(config_file: str | None = None, context: str | None = None,
                     client_configuration: Configuration | None = None,
                     persist_config: bool = True, temp_file_path: str | None = None) -> None: ...
def load_incluster_config(client_configuration: Configuration | None = None,
                          try_refresh_token: bool = True) -> None: ...
def __getattr__(name: str) -> Any: ...
