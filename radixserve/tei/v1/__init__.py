"""Generated gRPC stubs of `proto/tei/v1/tei.proto` (package `tei.v1`: Text Embeddings Inference's API, the part
radixserve serves). Do not edit them: change the .proto, then regenerate from the repository root with

    python -m grpc_tools.protoc -Iradixserve=proto --python_out=. --grpc_python_out=. proto/tei/v1/tei.proto

(the `-I` mapping puts them in this package) using the grpcio-tools version pinned in pyproject.toml's `test` extra;
tests/test_grpc_stubs.py fails while the checked-in files differ from a fresh generation.

They define `tei.v1` in protobuf's default descriptor pool, as `tei-client`'s own stubs do, so one process cannot
import both: the server needs only these; a process that calls with tei-client must not import `deployments`.
"""
