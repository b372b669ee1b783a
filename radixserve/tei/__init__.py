"""Stubs of other servers' gRPC APIs that radixserve also serves: `radixserve.tei.v1` (Text Embeddings Inference)."""
