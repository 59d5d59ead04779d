"""The TensorRT-LLM toolchain: trtllm-build commands per release, engine directories and their manifests, container
paths, and the LLM API's model.yaml. Nothing here imports tensorrt_llm: it writes what TensorRT-LLM reads."""
