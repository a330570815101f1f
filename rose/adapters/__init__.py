"""LoRA adapters chosen per sequence: read in PEFT's format (``peft.py``),
placed on a family's fused projections (``placement.py``), applied per
step on the rows that chose them (``linear.py``), kept resident under
bounds (``bank.py``). The step that runs them is ``rose/step/lora.py``."""

from .bank import MAX_ADAPTERS, MAX_RANK, AdapterInfo, Bank
from .linear import AdapterStep

__all__ = ["MAX_ADAPTERS", "MAX_RANK", "AdapterInfo", "AdapterStep", "Bank"]
