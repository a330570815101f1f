"""Baselines measured in the same run as our stack: in-process
sentence-transformers and transformers, Infinity, and a minimal FastAPI
server."""
