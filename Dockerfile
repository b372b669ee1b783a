# syntax=docker/dockerfile:1
# The radixserve image that k8s/rayservice.yaml runs: the official Ray GPU image plus this project with its `gpu`
# extra, built from the repository root:
#
#   docker build -t registry.example.com/radixserve:0.1.0-ray2.60.0-py311-cu128 .
#
# The base image's Ray must be the version pyproject.toml pins (pip would otherwise replace the image's Ray, and
# every node of a cluster must run one Ray), its Python one that requires-python allows; CUDA 12.8 runs on
# Ampere, Hopper and Blackwell GPUs. tests/test_k8s_image.py checks these pins and the RayService's image tag.
FROM rayproject/ray:2.60.0-py311-cu128

# flash-attn's setup.py imports torch and builds against that exact torch and CUDA, so torch is installed first and
# the build sees it (--no-build-isolation; build isolation would hide it). Its setup first downloads a matching
# prebuilt wheel from the flash-attn releases; without one it compiles with nvcc for a long time (MAX_JOBS bounds
# that compile's memory). A wheel chosen by hand skips both:
#   docker build --build-arg FLASH_ATTN_WHEEL=<flash_attn-...-cp311-cp311-linux_x86_64.whl URL> ...
ARG FLASH_ATTN_WHEEL=""
ENV MAX_JOBS=4

WORKDIR /home/ray/radixserve
COPY --chown=ray:users pyproject.toml README.md ./
COPY --chown=ray:users radix_core ./radix_core
COPY --chown=ray:users deployments ./deployments
COPY --chown=ray:users radixserve ./radixserve

# torch as pyproject.toml pins it (PyPI's default CUDA build), and what a build without isolation needs.
RUN pip install --no-cache-dir "torch==2.13.0" "setuptools>=69" wheel packaging ninja psutil \
 && if [ -n "$FLASH_ATTN_WHEEL" ]; then pip install --no-cache-dir "$FLASH_ATTN_WHEEL"; fi \
 && pip install --no-cache-dir --no-build-isolation ".[gpu]" \
 && python -c "import deployments.app, radix_core"
