"""TCP → unix socket forwarder, run in the VM so the host's gRPC client reaches the node plugin.

`cephcsi --endpoint` serves unix sockets only (a CSI plugin is reached by the kubelet through
a socket file), and a unix socket does not cross the VM boundary. This relays each TCP
connection on the guest's bridge address to the plugin's socket, byte for byte (gRPC's
HTTP/2 does not care), so the tests on the host call the plugin with the same stubs, deadlines
and status codes as the node tests that run on the host. A connection made while the plugin is
down (a restart test) is closed at once; the gRPC channel reconnects.

    python3 forward.py LISTEN_ADDRESS PORT SOCKET_PATH
"""
from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


async def main(address: str, port: int, socket_path: str) -> None:
    async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            plugin_reader, plugin_writer = await asyncio.open_unix_connection(socket_path)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pipe(client_reader, plugin_writer), _pipe(plugin_reader, client_writer))

    server = await asyncio.start_server(relay, address, port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
