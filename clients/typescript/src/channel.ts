// A client of inventory.v1 with the project's gRPC service config, and its error details.
// The generated code (src/gen/) is written by `make clients`.

import { readFileSync } from "node:fs";
import {
  credentials,
  Metadata,
  status,
  type CallOptions,
  type ClientUnaryCall,
  type ServiceError,
} from "@grpc/grpc-js";
import { ErrorInfo, RetryInfo } from "./gen/google/rpc/error_details.js";
import { Status } from "./gen/google/rpc/status.js";
import { InventoryServiceClient } from "./gen/inventory/v1/inventory.js";

// deploy/grpc/service-config.json: retries (with the server's pushback), per-method timeouts,
// retry throttling and round_robin. INVENTORY_SERVICE_CONFIG names another file.
const serviceConfigFile =
  process.env.INVENTORY_SERVICE_CONFIG ||
  new URL("../../../deploy/grpc/service-config.json", import.meta.url);

/** A plaintext client that retries as the service config says. */
export function connect(target: string): InventoryServiceClient {
  return new InventoryServiceClient(target, credentials.createInsecure(), {
    "grpc.service_config": readFileSync(serviceConfigFile, "utf8"),
    "grpc.enable_retries": 1,
  });
}

/** The bearer token, when the server wants one (a plaintext port takes tokens only on
 * loopback or behind a sidecar that terminates TLS). */
export function callMetadata(token: string | undefined): Metadata {
  const metadata = new Metadata();
  if (token) metadata.set("authorization", `Bearer ${token}`);
  return metadata;
}

type Unary<Req, Res> = (
  request: Req,
  metadata: Metadata,
  options: Partial<CallOptions>,
  callback: (error: ServiceError | null, response: Res) => void,
) => ClientUnaryCall;

/** One unary call as a promise: `await unary(client, client.reserve, request, metadata)`. */
export function unary<Req, Res>(
  client: InventoryServiceClient,
  method: Unary<Req, Res>,
  request: Req,
  metadata: Metadata,
): Promise<Res> {
  return new Promise((resolve, reject) => {
    method.call(client, request, metadata, {}, (error, response) =>
      error ? reject(error) : resolve(response),
    );
  });
}

export interface Refusal {
  code: status;
  message: string;
  /** google.rpc.ErrorInfo.reason, one of the proto's ErrorReason names. */
  reason?: string;
  /** google.rpc.ErrorInfo.metadata. */
  metadata: { [key: string]: string };
  /** google.rpc.RetryInfo.retry_delay, in seconds. */
  retryDelay?: number;
  /** The same delay as the `grpc-retry-pushback-ms` trailer. */
  pushbackMs?: string;
}

/** Reads the google.rpc.Status the server sends in `grpc-status-details-bin`. */
export function refusal(error: ServiceError): Refusal {
  const answer: Refusal = { code: error.code, message: error.details, metadata: {} };
  const [details] = error.metadata.get("grpc-status-details-bin");
  for (const detail of details ? Status.decode(details as Buffer).details : []) {
    if (detail.typeUrl === "type.googleapis.com/google.rpc.ErrorInfo") {
      const info = ErrorInfo.decode(detail.value);
      answer.reason = info.reason;
      answer.metadata = info.metadata;
    } else if (detail.typeUrl === "type.googleapis.com/google.rpc.RetryInfo") {
      const delay = RetryInfo.decode(detail.value).retryDelay;
      answer.retryDelay = (delay?.seconds ?? 0) + (delay?.nanos ?? 0) / 1e9;
    }
  }
  const [pushback] = error.metadata.get("grpc-retry-pushback-ms");
  if (pushback !== undefined) answer.pushbackMs = pushback.toString();
  return answer;
}

export function isServiceError(error: unknown): error is ServiceError {
  return error instanceof Error && typeof (error as ServiceError).code === "number";
}

export function targetFromEnv(): string {
  const target = process.env.INVENTORY_TARGET;
  if (!target) {
    console.error("INVENTORY_TARGET is not set (host:port of a plaintext inventory-server)");
    process.exit(2);
  }
  return target;
}
