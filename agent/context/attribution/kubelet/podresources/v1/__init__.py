"""``k8s.io/kubelet/pkg/apis/podresources/v1``: vendored api.proto and its generated stubs.

Do not edit ``api_pb2*.py`` by hand; regenerate them (command in ../README.md).
"""
