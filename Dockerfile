# syntax=docker/dockerfile:1
# The radixserve image that k8s/rayservice.yaml runs: the official Ray GPU image plus this project with its `gpu`
# extra, built from the repository root:
#
#   docker build -t registry.example.com/radixserve:0.1.0-ray2.60.0-py311-cu130 .
#
# The base image's Ray must be the version pyproject.toml pins (pip would otherwise replace the image's Ray, and
# every node of a cluster must run one Ray), its Python one that requires-python allows, and its CUDA the major
# version of the torch that pyproject.toml pins: PyPI's torch 2.13.0 for Linux x86-64 is a CUDA 13.0 build
# (it requires cuda-toolkit 13.0.3 and triton 3.7.1). CUDA 13.0 needs an NVIDIA driver of at least 580 on every
# GPU node (Turing to Blackwell; flash-attn 4 runs on compute capability 8.x to 12.x, Ampere and newer).
# tests/test_k8s_image.py checks these versions and the RayService's image tag.
FROM rayproject/ray:2.60.0-py311-cu130

# Ray's gRPC proxy refuses messages over this many bytes before any of our code runs (its default is 2 GiB): set
# from the app's limits.max_request_bytes (16 MiB) plus 64 KiB for the envelope, so a request just over the
# limit still gets the ingress's own RESOURCE_EXHAUSTED naming max_request_bytes. Change both together
# (tests/test_k8s_image.py checks they agree).
ENV RAY_SERVE_GRPC_MAX_MESSAGE_SIZE=16842752

# Compiled kernels persist across replica restarts (radix_core.Engine.warm_up compiles every variant before a replica
# reports ready): flash-attn 4 keeps them in memory only unless its CuTe DSL cache is enabled, and Triton's cache
# would sit in ~/.triton. Both under one directory, in the container's writable layer (kept while it lives); on k8s
# point them at the workers' shared volume so new pods load kernels compiled before (bench/results/gpu/NOTES.md).
# Both caches key entries by GPU architecture and library version, so one directory serves mixed GPUs and upgrades.
ENV FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 \
    FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/home/ray/.cache/radixserve/flash-attn-cute \
    TRITON_CACHE_DIR=/home/ray/.cache/radixserve/triton

WORKDIR /home/ray/radixserve
COPY --chown=ray:users pyproject.toml README.md ./
COPY --chown=ray:users radix_core ./radix_core
COPY --chown=ray:users deployments ./deployments
COPY --chown=ray:users radixserve ./radixserve

# All wheels, nothing compiles: torch (CUDA 13.0) and triton as pinned, and the `gpu` extra's flash-attn 4, whose
# CuTe DSL kernels are compiled at first use on the GPU. The last line imports flash-attn 4 with the CuTe DSL's
# native libraries and checks that torch is the CUDA build the base image was chosen for.
RUN pip install --no-cache-dir ".[gpu]" \
 && python -c "import deployments.app, radix_core, triton, flash_attn.cute, cutlass, torch; \
assert torch.version.cuda.startswith('13.'), f'torch {torch.__version__} is built for CUDA {torch.version.cuda}'"
