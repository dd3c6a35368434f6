#!/usr/bin/python3
"""The VM test node's command runner (installed in the image as /usr/local/sbin/cephcsi-vm-runner).

The host drops a request in the 9p control share (`<share>/in/<id>.json`: {"script", "timeout"})
by writing a temporary name and renaming it, so the runner never reads half a file. The runner
claims it by renaming it away, runs the script with bash in its own thread (commands may run
concurrently: a test's background writer must not block the next command), and writes
`<share>/out/<id>.json` ({"rc", "stdout", "stderr", "seconds"}) the same way. A script that
outlives its timeout is killed with its whole process group (rc -9). Background processes a
script starts must be `setsid` with their output redirected, or the runner waits for them.

`<share>/ready` says the runner is serving (the host removes it before every boot).
"""
import json
import os
import signal
import subprocess
import threading
import time

SHARE = "/run/vmctl"


def mount_share() -> None:
    os.makedirs(SHARE, exist_ok=True)
    if os.path.ismount(SHARE):
        return
    subprocess.run(
        ["mount", "-t", "9p", "-o", "trans=virtio,version=9p2000.L,msize=262144,cache=none", "vmctl", SHARE],
        check=True,
    )


def write_atomic(path: str, data: dict[str, object]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.rename(tmp, path)


def serve(request_path: str, request_id: str) -> None:
    started = time.monotonic()
    try:
        with open(request_path, encoding="utf-8") as handle:
            request = json.load(handle)
        os.unlink(request_path)
        process = subprocess.Popen(
            ["bash", "-c", request["script"]], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True, cwd=request.get("cwd") or "/",
        )
        try:
            out, err = process.communicate(timeout=float(request.get("timeout", 600)))
            rc = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            rc = -9
            err += b"\n[runner] killed after its timeout\n"
        result: dict[str, object] = {"rc": rc, "stdout": out.decode(errors="replace"), "stderr": err.decode(errors="replace")}
    except Exception as error:  # the host must always get an answer
        result = {"rc": -1, "stdout": "", "stderr": f"[runner] {type(error).__name__}: {error}"}
    result["seconds"] = round(time.monotonic() - started, 3)
    write_atomic(os.path.join(SHARE, "out", f"{request_id}.json"), result)


def main() -> None:
    mount_share()
    for folder in ("in", "out", "work"):
        os.makedirs(os.path.join(SHARE, folder), exist_ok=True)
    with open("/proc/uptime", encoding="ascii") as handle:
        uptime = handle.read().split()[0]
    write_atomic(os.path.join(SHARE, "ready"), {"uptime": float(uptime), "kernel": os.uname().release})
    inbox = os.path.join(SHARE, "in")
    while True:
        for name in sorted(os.listdir(inbox)):
            if not name.endswith(".json"):
                continue
            request_id = name[: -len(".json")]
            claimed = os.path.join(SHARE, "work", name)
            try:
                os.rename(os.path.join(inbox, name), claimed)
            except OSError:
                continue
            threading.Thread(target=serve, args=(claimed, request_id), daemon=True).start()
        time.sleep(0.05)


if __name__ == "__main__":
    main()
