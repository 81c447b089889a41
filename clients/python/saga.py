#!/usr/bin/env python3
"""An order saga against a running inventory-server, from Python, checking every answer.

    INVENTORY_TARGET=127.0.0.1:50051 python saga.py

INVENTORY_TARGET  host:port of the server (plaintext). Required.
INVENTORY_TOKEN   bearer token, if the server wants credentials (seeding stock needs `admin`).
INVENTORY_RUN_ID  names this run's SKUs, order and keys (default: random), so runs never meet.
INVENTORY_MAX_WATCHERS  the server's MAX_WATCHERS (default 256, the server's default): the
                  last step opens that many WatchEvents streams and expects one more refused.

Prints each step; exits 0 when every step held, 1 when one did not, 2 on a usage error.
"""

from __future__ import annotations

import os
import sys
import uuid

import grpc
from google.protobuf.duration_pb2 import Duration

from inventory_channel import Stub, call_metadata, connect, pb, refusal, target_from_env

HELD = pb.RESERVATION_STATE_HELD
CONFIRMED = pb.RESERVATION_STATE_CONFIRMED


class StepFailed(Exception):
    pass


def check(condition: bool, what: str) -> None:
    if not condition:
        raise StepFailed(what)


def lines_of(reservation: pb.Reservation) -> dict:
    """(held, confirmed, released) per SKU."""
    return {line.sku: (line.held, line.confirmed, line.released) for line in reservation.lines}


def refused(call, request, metadata) -> grpc.RpcError:
    try:
        answer = call(request, metadata=metadata)
    except grpc.RpcError as error:
        return error
    raise StepFailed(f"expected a refusal, got {answer}")


def main() -> int:
    target = target_from_env()
    metadata = call_metadata(os.environ.get("INVENTORY_TOKEN"))
    run = os.environ.get("INVENTORY_RUN_ID") or uuid.uuid4().hex[:12]
    try:
        max_watchers = int(os.environ.get("INVENTORY_MAX_WATCHERS", "256"))
    except ValueError:
        print("INVENTORY_MAX_WATCHERS is a count", file=sys.stderr)
        return 2
    mug, cap = f"PY-{run}-MUG", f"PY-{run}-CAP"
    order_id = f"py-{run}"
    channel = connect(target)
    stub = Stub(channel)

    def stock(sku: str) -> tuple:
        level = stub.GetStock(pb.GetStockRequest(skus=[sku]), metadata=metadata).levels[0]
        return level.on_hand, level.reserved, level.available

    def seed() -> str:
        for sku, units in ((mug, 10), (cap, 5)):
            level = stub.AdjustStock(
                pb.AdjustStockRequest(sku=sku, delta=units, idempotency_key=f"{run}/seed/{sku}",
                                      reason="delivery"),
                metadata=metadata,
            )
            check(level.on_hand == units and level.available == units, f"seeded {level}")
        return f"{mug} 10 on hand, {cap} 5"

    reserve = pb.ReserveRequest(
        idempotency_key=f"{order_id}/reserve",
        order_id=order_id,
        lines=[pb.ReservationLine(sku=mug, quantity=3), pb.ReservationLine(sku=cap, quantity=1)],
        ttl=Duration(seconds=600),
    )
    held = {}

    def reserve_once() -> str:
        reservation = stub.Reserve(reserve, metadata=metadata)
        check(reservation.state == HELD, f"state {reservation.state}")
        check(lines_of(reservation) == {mug: (3, 0, 0), cap: (1, 0, 0)},
              f"lines {reservation.lines}")
        held["id"] = reservation.reservation_id
        return f"reservation {reservation.reservation_id} HELD: {mug} 3, {cap} 1"

    def reserve_again() -> str:
        # The same key and request: the stored outcome, and stock moves once.
        again = stub.Reserve(reserve, metadata=metadata)
        check(again.reservation_id == held["id"], f"a second reservation {again.reservation_id}")
        check(stock(mug) == (10, 3, 7), f"{mug} at {stock(mug)}")
        return f"same reservation {again.reservation_id}; {mug} reserved 3 (once)"

    def key_reused() -> str:
        other = pb.ReserveRequest(idempotency_key=reserve.idempotency_key, order_id=order_id,
                                  lines=[pb.ReservationLine(sku=mug, quantity=1)])
        answer = refusal(refused(stub.Reserve, other, metadata))
        check(answer.code == grpc.StatusCode.ALREADY_EXISTS, f"code {answer.code}")
        check(answer.reason == "IDEMPOTENCY_KEY_REUSED", f"reason {answer.reason}")
        return f"{answer.code.name} {answer.reason}"

    def confirm_part() -> str:
        # Ship 2 mugs now: lines and a key, so a retry cannot confirm twice.
        ship = pb.ConfirmReservationRequest(
            reservation_id=held["id"], lines=[pb.ReservationLine(sku=mug, quantity=2)],
            idempotency_key=f"{order_id}/ship-1",
        )
        for _ in range(2):
            reservation = stub.ConfirmReservation(ship, metadata=metadata)
            check(reservation.state == HELD, f"state {reservation.state}")
            check(lines_of(reservation)[mug] == (1, 2, 0), f"lines {reservation.lines}")
        check(stock(mug) == (8, 1, 7), f"{mug} at {stock(mug)}")
        return f"{mug}: 2 confirmed, 1 held (sent twice, confirmed once); on hand 8"

    def release_part() -> str:
        back = pb.ReleaseReservationRequest(
            reservation_id=held["id"], lines=[pb.ReservationLine(sku=mug, quantity=1)],
            idempotency_key=f"{order_id}/release-1",
        )
        reservation = stub.ReleaseReservation(back, metadata=metadata)
        check(reservation.state == HELD, f"state {reservation.state}")
        check(lines_of(reservation) == {mug: (0, 2, 1), cap: (1, 0, 0)},
              f"lines {reservation.lines}")
        check(stock(mug) == (8, 0, 8), f"{mug} at {stock(mug)}")
        return f"{mug}: 1 released; {cap} still held"

    cancel = pb.CancelOrderRequest(order_id=order_id, idempotency_key=f"{order_id}/cancel",
                                   reason="payment failed")

    def cancel_order() -> str:
        for _ in range(2):
            answer = stub.CancelOrder(cancel, metadata=metadata)
            check([r.reservation_id for r in answer.reservations] == [held["id"]],
                  f"reservations {answer.reservations}")
            reservation = answer.reservations[0]
            check(reservation.state == CONFIRMED, f"state {reservation.state}")
            check(lines_of(reservation) == {mug: (0, 2, 1), cap: (0, 0, 1)},
                  f"lines {reservation.lines}")
        check(stock(cap) == (5, 0, 5), f"{cap} at {stock(cap)}")
        return f"{cap} released, reservation CONFIRMED (2 mugs shipped); sent twice"

    def reserve_after_cancel() -> str:
        late = pb.ReserveRequest(idempotency_key=f"{order_id}/reserve-2", order_id=order_id,
                                 lines=[pb.ReservationLine(sku=cap, quantity=1)])
        answer = refusal(refused(stub.Reserve, late, metadata))
        check(answer.code == grpc.StatusCode.FAILED_PRECONDITION, f"code {answer.code}")
        check(answer.reason == "ORDER_CANCELLED", f"reason {answer.reason}")
        check(answer.metadata.get("order_id") == order_id, f"metadata {answer.metadata}")
        return f"{answer.code.name} {answer.reason} order_id={answer.metadata['order_id']}"

    def retry_info() -> str:
        # Streams are not retried (no retryPolicy names WatchEvents): open them until the
        # server's MAX_WATCHERS refuses one, with RESOURCE_EXHAUSTED and a RetryInfo delay.
        streams = []
        try:
            for _ in range(max_watchers + 1):
                stream = stub.WatchEvents(pb.WatchEventsRequest(after_sequence=0),
                                          metadata=metadata, timeout=30)
                streams.append(stream)
                try:
                    next(stream)  # the saga's own events are there: an open stream sends one
                except grpc.RpcError as error:
                    answer = refusal(error)
                    break
            else:
                raise StepFailed(f"{max_watchers + 1} streams open, none refused")
        finally:
            for stream in streams:
                stream.cancel()
        check(answer.code == grpc.StatusCode.RESOURCE_EXHAUSTED, f"code {answer.code}")
        check(answer.reason == "TOO_MANY_WATCHERS", f"reason {answer.reason}")
        check(answer.retry_delay is not None and answer.retry_delay > 0,
              f"delay {answer.retry_delay}")
        check(answer.pushback_ms == str(round(answer.retry_delay * 1000)),
              f"grpc-retry-pushback-ms {answer.pushback_ms}")
        return (f"stream {len(streams)}: {answer.code.name} {answer.reason}, "
                f"retry after {answer.retry_delay}s (pushback {answer.pushback_ms} ms)")

    steps = [
        ("seed stock", seed),
        ("reserve", reserve_once),
        ("reserve again, same key", reserve_again),
        ("same key, other request", key_reused),
        ("confirm part", confirm_part),
        ("release part", release_part),
        ("cancel the order", cancel_order),
        ("reserve after the cancel", reserve_after_cancel),
        ("RetryInfo from a refusal", retry_info),
    ]
    print(f"saga {order_id} against {target}", flush=True)
    with channel:
        for number, (name, step) in enumerate(steps, 1):
            try:
                outcome = step()
            except StepFailed as failed:
                print(f"step {number} {name}: FAILED: {failed}")
                return 1
            except grpc.RpcError as error:
                answer = refusal(error)
                print(f"step {number} {name}: FAILED: "
                      f"{answer.code.name} {answer.reason or '-'} {answer.message}")
                return 1
            print(f"step {number} {name}: ok: {outcome}", flush=True)
    print(f"saga {order_id}: all {len(steps)} steps held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
