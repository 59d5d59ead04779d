"""Build stages: compatibility checks, memory plan, plan, quantization, orchestration."""
