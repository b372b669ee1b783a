"""Ray Serve deployments of radixserve: thin transport, routing and batching around `radix_core.Engine`."""
