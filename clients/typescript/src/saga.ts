// An order saga against a running inventory-server, from TypeScript, checking every answer.
//
//     INVENTORY_TARGET=127.0.0.1:50051 npx tsx src/saga.ts
//
// INVENTORY_TARGET  host:port of the server (plaintext). Required.
// INVENTORY_TOKEN   bearer token, if the server wants credentials (seeding stock needs `admin`).
// INVENTORY_RUN_ID  names this run's SKUs, order and keys (default: random), so runs never meet.
// INVENTORY_MAX_WATCHERS  the server's MAX_WATCHERS (default 256, the server's default): the
//                   last step opens that many WatchEvents streams and expects one more refused.
//
// Prints each step; exits 0 when every step held, 1 when one did not, 2 on a usage error.

import { randomUUID } from "node:crypto";
import { status, type ClientReadableStream, type ServiceError } from "@grpc/grpc-js";
import {
  AdjustStockRequest,
  CancelOrderRequest,
  ConfirmReservationRequest,
  GetStockRequest,
  ReleaseReservationRequest,
  ReservationState,
  ReserveRequest,
  WatchEventsRequest,
  type Event,
  type Reservation,
} from "./gen/inventory/v1/inventory.js";
import { callMetadata, connect, isServiceError, refusal, targetFromEnv, unary } from "./channel.js";

const HELD = ReservationState.RESERVATION_STATE_HELD;
const CONFIRMED = ReservationState.RESERVATION_STATE_CONFIRMED;

class StepFailed extends Error {}

function check(condition: boolean, what: string): void {
  if (!condition) throw new StepFailed(what);
}

/** "held/confirmed/released" per SKU. */
function linesOf(reservation: Reservation): Record<string, string> {
  return Object.fromEntries(
    reservation.lines.map((line) => [line.sku, `${line.held}/${line.confirmed}/${line.released}`]),
  );
}

function same(actual: unknown, expected: unknown): boolean {
  return JSON.stringify(actual) === JSON.stringify(expected);
}

function checkLines(reservation: Reservation, expected: Record<string, string>): void {
  check(same(linesOf(reservation), expected), `lines ${JSON.stringify(reservation.lines)}`);
}

async function refused(call: Promise<unknown>): Promise<ServiceError> {
  let answer: unknown;
  try {
    answer = await call;
  } catch (error) {
    if (isServiceError(error)) return error;
    throw error;
  }
  throw new StepFailed(`expected a refusal, got ${JSON.stringify(answer)}`);
}

async function main(): Promise<number> {
  const target = targetFromEnv();
  const metadata = callMetadata(process.env.INVENTORY_TOKEN);
  const run = process.env.INVENTORY_RUN_ID || randomUUID().replaceAll("-", "").slice(0, 12);
  const maxWatchers = Number(process.env.INVENTORY_MAX_WATCHERS ?? "256");
  if (!Number.isInteger(maxWatchers) || maxWatchers < 0) {
    console.error("INVENTORY_MAX_WATCHERS is a count");
    return 2;
  }
  const [mug, cap] = [`TS-${run}-MUG`, `TS-${run}-CAP`];
  const orderId = `ts-${run}`;
  const client = connect(target);

  const stock = async (sku: string): Promise<number[]> => {
    const request = GetStockRequest.fromPartial({ skus: [sku] });
    const answer = await unary(client, client.getStock, request, metadata);
    const level = answer.levels[0];
    return [level.onHand, level.reserved, level.available];
  };

  const seed = async (): Promise<string> => {
    for (const [sku, units] of [[mug, 10], [cap, 5]] as const) {
      const level = await unary(client, client.adjustStock, AdjustStockRequest.fromPartial({
        sku, delta: units, idempotencyKey: `${run}/seed/${sku}`, reason: "delivery",
      }), metadata);
      check(level.onHand === units && level.available === units, `seeded ${JSON.stringify(level)}`);
    }
    return `${mug} 10 on hand, ${cap} 5`;
  };

  const reserve = ReserveRequest.fromPartial({
    idempotencyKey: `${orderId}/reserve`,
    orderId,
    lines: [{ sku: mug, quantity: 3 }, { sku: cap, quantity: 1 }],
    ttl: { seconds: 600, nanos: 0 },
  });
  let reservationId = "";

  const reserveOnce = async (): Promise<string> => {
    const reservation = await unary(client, client.reserve, reserve, metadata);
    check(reservation.state === HELD, `state ${reservation.state}`);
    checkLines(reservation, { [cap]: "1/0/0", [mug]: "3/0/0" });
    reservationId = reservation.reservationId;
    return `reservation ${reservationId} HELD: ${mug} 3, ${cap} 1`;
  };

  const reserveAgain = async (): Promise<string> => {
    // The same key and request: the stored outcome, and stock moves once.
    const again = await unary(client, client.reserve, reserve, metadata);
    check(again.reservationId === reservationId, `a second reservation ${again.reservationId}`);
    check(same(await stock(mug), [10, 3, 7]), `${mug} at ${await stock(mug)}`);
    return `same reservation ${again.reservationId}; ${mug} reserved 3 (once)`;
  };

  const keyReused = async (): Promise<string> => {
    const other = ReserveRequest.fromPartial({
      idempotencyKey: reserve.idempotencyKey, orderId, lines: [{ sku: mug, quantity: 1 }],
    });
    const answer = refusal(await refused(unary(client, client.reserve, other, metadata)));
    check(answer.code === status.ALREADY_EXISTS, `code ${status[answer.code]}`);
    check(answer.reason === "IDEMPOTENCY_KEY_REUSED", `reason ${answer.reason}`);
    return `${status[answer.code]} ${answer.reason}`;
  };

  const confirmPart = async (): Promise<string> => {
    // Ship 2 mugs now: lines and a key, so a retry cannot confirm twice.
    const ship = ConfirmReservationRequest.fromPartial({
      reservationId, lines: [{ sku: mug, quantity: 2 }], idempotencyKey: `${orderId}/ship-1`,
    });
    for (let attempt = 0; attempt < 2; attempt++) {
      const reservation = await unary(client, client.confirmReservation, ship, metadata);
      check(reservation.state === HELD, `state ${reservation.state}`);
      check(linesOf(reservation)[mug] === "1/2/0", `lines ${JSON.stringify(reservation.lines)}`);
    }
    check(same(await stock(mug), [8, 1, 7]), `${mug} at ${await stock(mug)}`);
    return `${mug}: 2 confirmed, 1 held (sent twice, confirmed once); on hand 8`;
  };

  const releasePart = async (): Promise<string> => {
    const back = ReleaseReservationRequest.fromPartial({
      reservationId, lines: [{ sku: mug, quantity: 1 }], idempotencyKey: `${orderId}/release-1`,
    });
    const reservation = await unary(client, client.releaseReservation, back, metadata);
    check(reservation.state === HELD, `state ${reservation.state}`);
    checkLines(reservation, { [cap]: "1/0/0", [mug]: "0/2/1" });
    check(same(await stock(mug), [8, 0, 8]), `${mug} at ${await stock(mug)}`);
    return `${mug}: 1 released; ${cap} still held`;
  };

  const cancel = CancelOrderRequest.fromPartial({
    orderId, idempotencyKey: `${orderId}/cancel`, reason: "payment failed",
  });

  const cancelOrder = async (): Promise<string> => {
    for (let attempt = 0; attempt < 2; attempt++) {
      const answer = await unary(client, client.cancelOrder, cancel, metadata);
      check(same(answer.reservations.map((r) => r.reservationId), [reservationId]),
        `reservations ${JSON.stringify(answer.reservations)}`);
      const [reservation] = answer.reservations;
      check(reservation.state === CONFIRMED, `state ${reservation.state}`);
      checkLines(reservation, { [cap]: "0/0/1", [mug]: "0/2/1" });
    }
    check(same(await stock(cap), [5, 0, 5]), `${cap} at ${await stock(cap)}`);
    return `${cap} released, reservation CONFIRMED (2 mugs shipped); sent twice`;
  };

  const reserveAfterCancel = async (): Promise<string> => {
    const late = ReserveRequest.fromPartial({
      idempotencyKey: `${orderId}/reserve-2`, orderId, lines: [{ sku: cap, quantity: 1 }],
    });
    const answer = refusal(await refused(unary(client, client.reserve, late, metadata)));
    check(answer.code === status.FAILED_PRECONDITION, `code ${status[answer.code]}`);
    check(answer.reason === "ORDER_CANCELLED", `reason ${answer.reason}`);
    check(answer.metadata.order_id === orderId, `metadata ${JSON.stringify(answer.metadata)}`);
    return `${status[answer.code]} ${answer.reason} order_id=${answer.metadata.order_id}`;
  };

  const retryInfo = async (): Promise<string> => {
    // Streams are not retried (no retryPolicy names WatchEvents): open them until the
    // server's MAX_WATCHERS refuses one, with RESOURCE_EXHAUSTED and a RetryInfo delay.
    const streams: ClientReadableStream<Event>[] = [];
    let error: ServiceError | undefined;
    try {
      while (!error && streams.length < maxWatchers + 1) {
        const request = WatchEventsRequest.fromPartial({ afterSequence: 0 });
        const stream = client.watchEvents(request, metadata, { deadline: Date.now() + 30_000 });
        streams.push(stream);
        // The saga's own events are there: an open stream sends one.
        error = await new Promise<ServiceError | undefined>((resolve) => {
          stream.once("data", () => resolve(undefined));
          stream.once("error", resolve);
        });
        stream.on("error", () => {}); // the cancel below ends it with CANCELLED
      }
    } finally {
      for (const stream of streams) stream.cancel();
    }
    if (!error) throw new StepFailed(`${maxWatchers + 1} streams open, none refused`);
    const answer = refusal(error);
    check(answer.code === status.RESOURCE_EXHAUSTED, `code ${status[answer.code]}`);
    check(answer.reason === "TOO_MANY_WATCHERS", `reason ${answer.reason}`);
    check(answer.retryDelay !== undefined && answer.retryDelay > 0, `delay ${answer.retryDelay}`);
    check(answer.pushbackMs === String(Math.round(answer.retryDelay! * 1000)),
      `grpc-retry-pushback-ms ${answer.pushbackMs}`);
    return `stream ${streams.length}: ${status[answer.code]} ${answer.reason}, ` +
      `retry after ${answer.retryDelay}s (pushback ${answer.pushbackMs} ms)`;
  };

  const steps: [string, () => Promise<string>][] = [
    ["seed stock", seed],
    ["reserve", reserveOnce],
    ["reserve again, same key", reserveAgain],
    ["same key, other request", keyReused],
    ["confirm part", confirmPart],
    ["release part", releasePart],
    ["cancel the order", cancelOrder],
    ["reserve after the cancel", reserveAfterCancel],
    ["RetryInfo from a refusal", retryInfo],
  ];
  console.log(`saga ${orderId} against ${target}`);
  try {
    for (const [index, [name, step]] of steps.entries()) {
      const title = `step ${index + 1} ${name}`;
      try {
        console.log(`${title}: ok: ${await step()}`);
      } catch (error) {
        if (error instanceof StepFailed) {
          console.log(`${title}: FAILED: ${error.message}`);
        } else if (isServiceError(error)) {
          const { code, reason, message } = refusal(error);
          console.log(`${title}: FAILED: ${status[code]} ${reason ?? "-"} ${message}`);
        } else {
          throw error;
        }
        return 1;
      }
    }
  } finally {
    client.close();
  }
  console.log(`saga ${orderId}: all ${steps.length} steps held`);
  return 0;
}

main().then(
  (code) => process.exit(code),
  (error) => {
    console.error(error);
    process.exit(1);
  },
);
