# The kernelspecs image EG's Helm chart copies into its kernelspecs directory at start (values.yaml:
# kernelspecs.image): our kernelspec, with the launch scripts of EG's own python_kubernetes kernelspec (they
# render the kernel's pod from kernel-pod.yaml.j2 and start it). Build it from the repository's root:
#   docker build -f deploy/kubernetes/kernelspecs.Dockerfile -t workbench-kernelspecs:0.1.0 .
ARG EG_VERSION=3.3.0
FROM elyra/enterprise-gateway:${EG_VERSION} AS eg
FROM busybox:1.36
COPY --from=eg /usr/local/share/jupyter/kernels/python_kubernetes/scripts /kernels/python_workbench/scripts
COPY deploy/kubernetes/kernelspecs/python_workbench/kernel.json /kernels/python_workbench/kernel.json
