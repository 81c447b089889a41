#!/usr/bin/env python3
"""Offers GetStock calls through a channel set up with deploy/grpc/service-config.json and
counts how they ended: against a saturated server, the server's own count of the calls it
received, divided by the calls offered, is what the config's retries cost it.

    INVENTORY_TARGET=127.0.0.1:50051 INVENTORY_CALLS=200 python throttle.py

INVENTORY_TARGET       host:port of the server (plaintext). Required.
INVENTORY_TOKEN        bearer token, if the server wants credentials.
INVENTORY_CALLS        calls to offer (default 100).
INVENTORY_CONCURRENCY  calls in flight at once (default 4).
INVENTORY_SKU          the SKU asked for (default THROTTLE-PROBE).
INVENTORY_SERVICE_CONFIG  another service config file (default deploy/grpc/service-config.json).

Prints one JSON line: {"offered", "codes": {code: calls}, "reasons": {reason: calls},
"seconds", "retry_throttling"}; exits 0 once every call has ended, 2 on a usage error.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc

from inventory_channel import (
    SERVICE_CONFIG, Stub, call_metadata, connect, pb, refusal, target_from_env,
)


def main() -> int:
    target = target_from_env()
    metadata = call_metadata(os.environ.get("INVENTORY_TOKEN"))
    try:
        offered = int(os.environ.get("INVENTORY_CALLS", "100"))
        concurrency = int(os.environ.get("INVENTORY_CONCURRENCY", "4"))
    except ValueError as error:
        print(f"INVENTORY_CALLS and INVENTORY_CONCURRENCY are counts: {error}", file=sys.stderr)
        return 2
    if offered < 1 or concurrency < 1:
        print("INVENTORY_CALLS and INVENTORY_CONCURRENCY are at least 1", file=sys.stderr)
        return 2
    request = pb.GetStockRequest(skus=[os.environ.get("INVENTORY_SKU", "THROTTLE-PROBE")])
    channel = connect(target)
    stub = Stub(channel)

    def offer(_: int) -> tuple:
        try:
            stub.GetStock(request, metadata=metadata)
            return "OK", None
        except grpc.RpcError as error:
            answer = refusal(error)
            return answer.code.name, answer.reason

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        outcomes = list(pool.map(offer, range(offered)))
    seconds = time.monotonic() - started
    channel.close()
    print(json.dumps({
        "offered": offered,
        "codes": dict(Counter(code for code, _ in outcomes)),
        "reasons": dict(Counter(reason for _, reason in outcomes if reason)),
        "seconds": round(seconds, 3),
        "retry_throttling": json.loads(SERVICE_CONFIG.read_text()).get("retryThrottling"),
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
