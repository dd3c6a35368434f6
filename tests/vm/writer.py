"""A writer that acknowledges: run in the VM (Debian's python3) against a file on a volume.

Appends numbered 16-byte records to DATA, fsyncs each, and only then appends the number to ACK
(a file outside the volume): every number in ACK is an acknowledged write, which must be in
DATA afterwards whatever happened to the node plugin meanwhile. Stops when STOP exists.

    python3 writer.py DATA ACK STOP
    python3 writer.py --verify DATA ACK   # prints "ok <acknowledged>" or what is missing
"""
from __future__ import annotations

import os
import sys


def write(data: str, ack: str, stop: str) -> None:
    fd = os.open(data, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    with open(ack, "a", encoding="ascii") as acks:
        number = 0
        while not os.path.exists(stop):
            os.write(fd, b"record %08d\n" % number)
            os.fsync(fd)
            acks.write(f"{number}\n")
            acks.flush()
            number += 1
    os.close(fd)


def verify(data: str, ack: str) -> int:
    with open(ack, encoding="ascii") as handle:
        acknowledged = [int(line) for line in handle if line.strip()]
    with open(data, "rb") as handle:
        written = {int(line.split()[1]) for line in handle.read().splitlines() if line.startswith(b"record ")}
    missing = [number for number in acknowledged if number not in written]
    if missing:
        print(f"lost {len(missing)} acknowledged writes, first {missing[:10]}")
        return 1
    print(f"ok {len(acknowledged)}")
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--verify":
        sys.exit(verify(sys.argv[2], sys.argv[3]))
    write(sys.argv[1], sys.argv[2], sys.argv[3])
