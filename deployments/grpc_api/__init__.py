"""The gRPC face of the application, served by Ray Serve's gRPC proxy (port 9000): one module per API
(`scoring`: radixserve.v1, `tei`: tei.v1, `health`: grpc.health.v1), each a `GrpcService` of `Rpc`s, registered in
`registry.SERVICES`, which gives the ingress its methods (`with_rpcs`). What every call shares (key, size,
status, metering) is `calls`; streams read within bounds are `streams`."""

from deployments.grpc_api.registry import with_rpcs

__all__ = ["with_rpcs"]
