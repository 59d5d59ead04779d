"""An OpenAI-compatible HTTP API (``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``) in front of the
Triton server that serves a trtspec repository (``trtspec serve REPO --openai-port PORT``)."""
