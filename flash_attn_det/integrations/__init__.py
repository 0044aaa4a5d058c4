"""Integrations of flash_attn_det into other libraries (each imports its library lazily)."""
