"""Write a one-layer docker-archive image holding only a static /pause binary.

    python3 pause_image.py PAUSE_BINARY IMAGE_NAME OUT.tar

No registry is reachable from the test machines, and containerd needs its sandbox image
locally; this is the whole image (`ctr -n k8s.io images import OUT.tar`). Standard library only,
so tests/e2e/node/build.sh can run it before any venv exists. Deterministic (fixed mtimes and
owners): the same binary gives the same image id.
"""
from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

# The same non-root user as registry.k8s.io/pause: the sandbox needs no privileges.
PAUSE_USER = "65535:65535"


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def layer_tar(binary: bytes) -> bytes:
    """The root filesystem: just /pause."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "pause", binary, 0o755)
    return buf.getvalue()


def docker_archive(binary: bytes, image_name: str) -> bytes:
    """manifest.json + image config + one layer, in the layout `docker save` writes."""
    layer = layer_tar(binary)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": ["/pause"], "User": PAUSE_USER, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "tests/e2e/node/build.sh (static pause.c)"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [image_name], "Layers": [layer_name]}]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, config_name, config_bytes)
        _add(tar, layer_name, layer)
        _add(tar, "manifest.json", json.dumps(manifest).encode())
    return buf.getvalue()


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    binary, name, out = Path(argv[1]), argv[2], Path(argv[3])
    out.write_bytes(docker_archive(binary.read_bytes(), name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
