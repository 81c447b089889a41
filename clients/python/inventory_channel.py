"""A channel to inventory.v1 with the project's gRPC service config, and its error details.

The generated code (`gen/`, written by `make clients`) is imported from beside this file.
"""

from __future__ import annotations

import os
import pathlib
import sys
from dataclasses import dataclass
from typing import Optional

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "gen"))

import grpc  # noqa: E402
from google.rpc import error_details_pb2  # noqa: E402
from grpc_status import rpc_status  # noqa: E402

try:
    from inventory.v1 import inventory_pb2 as pb  # noqa: F401  (used by the scripts)
    from inventory.v1 import inventory_pb2_grpc as pb_grpc
except ModuleNotFoundError:
    print(f"no generated code in {HERE / 'gen'}: run `make clients`", file=sys.stderr)
    sys.exit(2)

# deploy/grpc/service-config.json: retries (with the server's pushback), per-method
# timeouts, retry throttling and round_robin. INVENTORY_SERVICE_CONFIG names another file.
SERVICE_CONFIG = pathlib.Path(
    os.environ.get("INVENTORY_SERVICE_CONFIG")
    or HERE.parent.parent / "deploy" / "grpc" / "service-config.json"
)


def connect(target: str) -> grpc.Channel:
    """A plaintext channel that retries as the service config says."""
    return grpc.insecure_channel(
        target,
        options=[
            ("grpc.service_config", SERVICE_CONFIG.read_text()),
            ("grpc.enable_retries", 1),
        ],
    )


def call_metadata(token: Optional[str]) -> tuple:
    """The bearer token, when the server wants one (a plaintext port takes tokens only on
    loopback or behind a sidecar that terminates TLS)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


@dataclass
class Refusal:
    code: grpc.StatusCode
    message: str
    reason: Optional[str]  # google.rpc.ErrorInfo.reason, one of the proto's ErrorReason names
    metadata: dict  # google.rpc.ErrorInfo.metadata
    retry_delay: Optional[float]  # google.rpc.RetryInfo.retry_delay, in seconds
    pushback_ms: Optional[str]  # the same delay as the `grpc-retry-pushback-ms` trailer


def refusal(error: grpc.RpcError) -> Refusal:
    """Reads the google.rpc.Status the server sends in `grpc-status-details-bin`."""
    reason, metadata, retry_delay = None, {}, None
    status = rpc_status.from_call(error)
    for detail in status.details if status else []:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason, metadata = info.reason, dict(info.metadata)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retry_delay = retry.retry_delay.ToTimedelta().total_seconds()
    trailers = dict(error.trailing_metadata() or ())
    return Refusal(
        error.code(), error.details(), reason, metadata, retry_delay,
        trailers.get("grpc-retry-pushback-ms"),
    )


def target_from_env() -> str:
    target = os.environ.get("INVENTORY_TARGET")
    if not target:
        print("INVENTORY_TARGET is not set (host:port of a plaintext inventory-server)",
              file=sys.stderr)
        sys.exit(2)
    return target


Stub = pb_grpc.InventoryServiceStub
