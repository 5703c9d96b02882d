#!/usr/bin/env python3
"""Hostile clients for bench/overload.sh.
  hostile_clients.py idle PORT N HOLD_S        open N TCP connections to PORT, send nothing, hold them
                                               HOLD_S seconds; prints how many the server closed
  hostile_clients.py unread PORT N MAX_TOKENS  N streamed /v1/completions on the HTTP API whose
                                               responses are never read for 60 s"""
import socket
import sys
import time


def idle(port, n, hold_s):
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.setblocking(False)
        socks.append(s)
    print(f"opened {len(socks)}", flush=True)
    deadline = time.time() + hold_s
    closed = set()
    while time.time() < deadline and len(closed) < n:
        for i, s in enumerate(socks):
            if i in closed:
                continue
            try:
                if s.recv(65536) == b"":
                    closed.add(i)
            except BlockingIOError:
                pass
            except OSError:
                closed.add(i)
        time.sleep(0.5)
    print(f"closed by the server within {hold_s} s: {len(closed)}", flush=True)


def unread(port, n, max_tokens):
    body = ('{"model":"sim","prompt":[1,2,3,4],"max_tokens":%d,"stream":true}' % max_tokens).encode()
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
           + str(len(body)).encode() + b"\r\n\r\n" + body)
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the server's bytes wait in the server
        s.sendall(req)
        socks.append(s)
    print(f"sent {n} streams, reading none", flush=True)
    time.sleep(60)  # the router's log says which it cancelled (draining here would crawl: zero-window probes back off)
    for s in socks:
        s.close()


mode = sys.argv[1]
if mode == "idle":
    idle(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
else:
    unread(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
