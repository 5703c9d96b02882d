#!/usr/bin/env python3
"""A TCP proxy between the router and one worker, for the chaos bench: forwards LISTEN -> TARGET,
and on signals injects network faults: SIGUSR1 resets every open connection (a dropped link);
SIGUSR2 delays every forwarded chunk by DELAY_MS for DELAY_S seconds (a slow link).
  chaos_proxy.py LISTEN_PORT TARGET_PORT PORT_FILE [DELAY_MS] [DELAY_S]
Writes the port it listens on to PORT_FILE (LISTEN_PORT 0: any)."""
import asyncio
import signal
import socket
import sys
import time

listen_port, target_port, port_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
delay_ms = float(sys.argv[4]) if len(sys.argv) > 4 else 200.0
delay_s = float(sys.argv[5]) if len(sys.argv) > 5 else 3.0
conns = set()
slow_until = 0.0


async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            if time.monotonic() < slow_until:
                await asyncio.sleep(delay_ms / 1000.0)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError, OSError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def handle(client_reader, client_writer):
    try:
        target_reader, target_writer = await asyncio.open_connection("127.0.0.1", target_port)
    except OSError:
        client_writer.close()
        return
    pair = (client_writer, target_writer)
    conns.add(pair)
    try:
        await asyncio.gather(pipe(client_reader, target_writer), pipe(target_reader, client_writer))
    finally:
        conns.discard(pair)


def reset_all():
    for pair in list(conns):
        for w in pair:
            sock = w.get_extra_info("socket")
            if sock is not None:
                try:  # RST rather than FIN: the peer sees the link break
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                except OSError:
                    pass
            w.transport.abort()


def slow():
    global slow_until
    slow_until = time.monotonic() + delay_s


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, reset_all)
    loop.add_signal_handler(signal.SIGUSR2, slow)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(server.sockets[0].getsockname()[1]))
    import os
    os.replace(port_file + ".tmp", port_file)
    async with server:
        await server.serve_forever()


asyncio.run(main())
