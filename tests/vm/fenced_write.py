"""Run in a guest: try to write a token into an RBD image through librbd, as a node that was
fenced would, and say what happened (`wrote` or the error). Exit 0 only if the write was
acknowledged. The cephx key is read from a file (argv would show it to every process).

usage: python3 fenced_write.py MON_HOST POOL IMAGE USER KEY_FILE TOKEN
"""
from __future__ import annotations

import sys

import rados
import rbd

TIMEOUT_S = "20"  # a blocklisted client is refused at once; a hang here is a failure too


def main(mon_host: str, pool: str, image: str, user: str, key_file: str, token: str) -> int:
    with open(key_file, encoding="utf-8") as handle:
        key = handle.read().strip()
    conf = {"mon_host": mon_host, "key": key, "rados_osd_op_timeout": TIMEOUT_S, "rados_mon_op_timeout": TIMEOUT_S}
    cluster = rados.Rados(rados_id=user, conf=conf)
    try:
        cluster.connect(timeout=int(TIMEOUT_S))
        with cluster.open_ioctx(pool) as ioctx, rbd.Image(ioctx, image) as opened:
            data = token.encode()
            opened.write(data, opened.size() - len(data))
            opened.flush()
    except (rados.Error, rbd.Error) as error:
        print(f"refused: {type(error).__name__}: {error}")
        return 1
    finally:
        cluster.shutdown()
    print("wrote")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:7]))
