"""flash_attn.bert_padding for the shim."""
from flash_attn_det.bert_padding import *  # noqa: F401,F403
