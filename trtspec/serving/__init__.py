"""Serving: the tritonserver process (local binary or NGC docker), gRPC/HTTP clients and the benchmark."""
