# The hands' kernel image for Enterprise Gateway on Kubernetes: EG's Python kernel image (its kernel launcher,
# which answers EG's KubernetesProcessProxy) with the packages the workbench's own hands kernel has.
# Build it from the repository's root:
#   docker build -f deploy/kubernetes/kernel.Dockerfile -t workbench-kernel:0.1.0 .
# tests/hands/test_kubernetes_config.py checks that these packages are pyproject.toml's, with the same bounds.
ARG EG_VERSION=3.3.0
FROM elyra/kernel-py:${EG_VERSION}
USER root
RUN pip install --no-cache-dir \
    "ipykernel>=6.29" \
    "ipywidgets>=8.1" \
    "pandas>=2.0" \
    "matplotlib>=3.8" \
    "pyarrow>=14"
# the kernel runs as EG's unprivileged kernel user, never as root (EG refuses root by its unauthorized_users)
USER jovyan
WORKDIR /home/jovyan
