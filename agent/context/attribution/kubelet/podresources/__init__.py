"""Generated Python stubs for the kubelet pod-resources API; see README.md for provenance."""
