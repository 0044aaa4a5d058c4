"""flash_attn_det.bert_padding against flash_attn.bert_padding's behaviour: int32 indices (what
transformers' flash-attention glue passes at each decode step of a padded batch), gradients, and
the concatenated-sequences variant."""
import pytest
import torch

from flash_attn_det.bert_padding import (index_first_axis, pad_input, unpad_input,
                                         unpad_input_for_concatenated_sequences)

from conftest import make_gen, randn


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_pad_input_accepts_int32_indices_and_is_differentiable(index_dtype):
    gen = make_gen(3)
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    x = randn(gen, (3, 4, 2, 8), torch.float32)
    x_unpad, indices, cu, max_len, used = unpad_input(x, mask)
    assert cu.tolist() == [0, 3, 6, 7] and max_len == 3 and used.tolist() == [3, 3, 1]
    leaf = x_unpad.detach().clone().requires_grad_(True)
    out = pad_input(leaf, indices.to(index_dtype), 3, 4)
    assert torch.equal(out, torch.where(mask[:, :, None, None], x, torch.zeros(())))
    weight = randn(gen, out.shape, torch.float32)
    (out * weight).sum().backward()
    assert torch.equal(leaf.grad, weight.reshape(12, 2, 8)[indices])
    assert torch.equal(index_first_axis(x.reshape(12, 2, 8), indices.to(index_dtype)), x_unpad)


def test_unpad_input_for_concatenated_sequences():
    gen = make_gen(4)
    lengths = torch.tensor([[2, 3, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
    x = randn(gen, (3, 6, 5), torch.float32)
    packed, indices, cu, max_len = unpad_input_for_concatenated_sequences(x, lengths)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 2, 5, 11, 12] and max_len == 6
    assert indices.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12]
    assert torch.equal(packed, x.reshape(18, 5)[indices])
