"""Generated gRPC stubs of `proto/radixserve/v1/scoring.proto` (package `radixserve.v1`). Do not edit them: change
the .proto, then regenerate from the repository root with

    python -m grpc_tools.protoc -Iproto --python_out=. --grpc_python_out=. proto/radixserve/v1/scoring.proto

using the grpcio-tools version pinned in pyproject.toml's `test` extra (its protoc writes the version checks at the
top of the files); tests/test_grpc_stubs.py fails while the checked-in files differ from a fresh generation.
"""
