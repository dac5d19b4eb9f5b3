"""The HTTP load generator (its own process):
``python -m benchmarks._load PORT CLIENTS SECONDS [RATE]``.

``CLIENTS`` keep-alive HTTP/1.1 connections on loopback, each sending ``POST /charge`` with a
fresh ``Idempotency-Key`` (every request a first delivery: one claim and one completion)
for ``SECONDS``: as soon as the previous answer arrived (saturating load), or, with ``RATE``,
paced so that all clients together offer ``RATE`` requests/s (each client on its own fixed
schedule; a late answer delays only that client's next request).  Written on raw asyncio streams
(no HTTP client library) so that the generator costs as little CPU as possible on a
2-core machine.  Prints one JSON line: requests, errors, requests/s, latency p50/p99 (ms).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
import uuid

BODY = b'{"amount": 100}'


async def _client(port: int, until: float, tag: str, latencies: list[float],
                  errors: list[int], interval: float = 0.0) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        "POST /charge HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(BODY)}\r\nIdempotency-Key: "
    ).encode()
    n = 0
    next_at = time.monotonic() + interval * (hash(tag) % 1000) / 1000  # spread the starts
    try:
        while time.monotonic() < until:
            if interval:
                delay = next_at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                next_at += interval
            n += 1
            started = time.perf_counter()
            writer.write(head + f"{tag}-{n}\r\n\r\n".encode() + BODY)
            status = await _response(reader)
            latencies.append(time.perf_counter() - started)
            if status != 200:
                errors.append(status)
    finally:
        writer.close()


async def _response(reader: asyncio.StreamReader) -> int:
    """Read one response (status line, headers, a Content-Length body); its status."""
    header = await reader.readuntil(b"\r\n\r\n")
    lines = header.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if length:
        await reader.readexactly(length)
    return status


async def main(port: int, clients: int, seconds: float, rate: float = 0.0) -> dict[str, float]:
    latencies: list[float] = []
    errors: list[int] = []
    run = uuid.uuid4().hex[:8]
    started = time.monotonic()
    until = started + seconds
    interval = clients / rate if rate else 0.0
    await asyncio.gather(*(
        _client(port, until, f"{run}-{i}", latencies, errors, interval) for i in range(clients)
    ))
    elapsed = time.monotonic() - started
    latencies.sort()
    return {
        "requests": len(latencies),
        "errors": len(errors),
        "rps": round(len(latencies) / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1e3, 2) if latencies else 0.0,
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1e3, 2) if latencies else 0.0,
    }


if __name__ == "__main__":
    port, clients, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    rate = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    print(json.dumps(asyncio.run(main(port, clients, seconds, rate))))
